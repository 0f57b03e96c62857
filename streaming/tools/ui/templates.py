"""The pages of ``spark-abs ui`` as Jinja templates, by name: a frame
(``base.html``) and a macro that draws any ``streaming.tools.tables.Table``
(``parts.html``), and one template per page.  Everything the pages need is
served by the app itself (no fonts, scripts or styles from elsewhere)."""

from __future__ import annotations

__all__ = ["TEMPLATES"]

_BASE = """\
<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{{ title }} - spark-abs ui</title>
{% if refresh %}<meta http-equiv="refresh" content="{{ refresh }}">{% endif %}
{% if chart %}<script src="{{ url_for('plotly_js') }}"></script>{% endif %}
<style>
  body { font: 14px/1.45 system-ui, sans-serif; margin: 0; color: #1d2330; background: #f6f7f9; }
  header { background: #1d2330; color: #fff; padding: 10px 24px; display: flex; gap: 24px; align-items: baseline; }
  header a { color: #cfe0ff; text-decoration: none; margin-right: 16px; }
  header a.here { color: #fff; font-weight: 600; border-bottom: 2px solid #7fb0ff; }
  header .where { margin-left: auto; color: #aab3c5; font-size: 12px; }
  main { padding: 16px 24px 40px; }
  h1 { font-size: 20px; margin: 4px 0 12px; }
  h2 { font-size: 16px; margin: 24px 0 6px; }
  h3 { font-size: 13px; font-weight: 600; margin: 18px 0 4px; color: #3b4456; }
  table { border-collapse: collapse; background: #fff; box-shadow: 0 0 0 1px #dde1e8; }
  th, td { padding: 3px 10px; text-align: left; white-space: nowrap; }
  th { background: #eef1f5; font-weight: 600; font-size: 12px; }
  tbody tr:nth-child(even) { background: #fafbfc; }
  td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
  p.text { white-space: pre-wrap; font-family: ui-monospace, monospace; font-size: 12.5px; margin: 8px 0; }
  p.note, p.empty { color: #5b6478; font-size: 12.5px; }
  .problem { color: #a4161a; }
  .warn { color: #8a4b00; }
  #liveness .problem, #liveness .warn { font-weight: 600; }
  .badge { display: inline-block; padding: 0 8px; border-radius: 9px; background: #e3ecff; font-size: 12px; }
  pre.report { background: #fff; padding: 12px; box-shadow: 0 0 0 1px #dde1e8; overflow-x: auto; font-size: 12px; }
  img.chart { max-width: 100%; background: #fff; box-shadow: 0 0 0 1px #dde1e8; margin: 6px 0 12px; }
  form { margin: 8px 0; } form label { margin-right: 12px; }
</style>
</head>
<body>
<header>
  <strong>spark-abs</strong>
  <nav>
    <a href="{{ url_for('overview') }}" class="{{ 'here' if page == 'checkpoints' }}">checkpoints</a>
    <a href="{{ url_for('generations') }}" class="{{ 'here' if page == 'generations' }}">generations</a>
    <a href="{{ url_for('reports') }}" class="{{ 'here' if page == 'reports' }}">reports</a>
  </nav>
  <span class="where">job <b>{{ job }}</b> in {{ store }} &middot; {{ mode }}</span>
</header>
<main>
{% block main %}{% endblock %}
</main>
</body>
</html>
"""

_PARTS = """\
{% macro table(t, link=None, id=None) -%}
<section class="table"{% if id %} id="{{ id }}"{% endif %}>
{% if t.title %}<h3>{{ t.title }}</h3>{% endif %}
<table>
<thead><tr>{% for c in t.columns %}<th class="{{ 'num' if c in t.right }}">{{ c }}</th>{% endfor %}</tr></thead>
<tbody>
{% for row in t.rows %}<tr>{% for v in row %}{% set c = t.columns[loop.index0] %}<td class="{{ 'num' if c in t.right }}">
{%- if loop.first and link and v is not none %}<a href="{{ link(v) }}">{{ v }}</a>
{%- else %}{{ '-' if v is none else v }}{% endif %}</td>{% endfor %}</tr>
{% endfor %}
</tbody>
</table>
{% if not t.rows %}<p class="empty">none</p>{% endif %}
</section>
{%- endmacro %}

{% macro parts(items) -%}
{% for part in items %}
{% if part is string %}<p class="text">{{ part }}</p>{% else %}{{ table(part) }}{% endif %}
{% endfor %}
{%- endmacro %}
"""

_OVERVIEW = """\
{% extends "base.html" %}
{% from "parts.html" import table %}
{% block main %}
<h1>Checkpoints of job {{ job }}</h1>
{% if unknown %}
<p class="problem" id="unknown-job">The store {{ store }} holds no job named {{ job }}: no generation was
recorded and no checkpoint was written.  Check --store and --job (the job's name, as `spark-abs run --job` gave it).</p>
{% else %}
<p id="summary">
  generation <b>{{ generation }}</b> &middot;
  <b id="complete-count">{{ complete }}</b> complete checkpoint(s){% if incomplete %}, {{ incomplete }} without a manifest{% endif %} &middot;
  {% if pick is not none %}a restore picks checkpoint <a href="{{ url_for('checkpoint', checkpoint_id=pick) }}">{{ pick }}</a>
  {% else %}<span class="problem">no checkpoint verifies: a restore would start from the beginning</span>{% endif %}
  {% if refresh %}&middot; <span class="note">reads the store again every {{ refresh }} s</span>{% endif %}
</p>
<p id="liveness">{% for level, text in liveness.parts() %}<span class="{{ level }}">{{ text }}</span>
  {%- if not loop.last %} &middot; {% endif %}{% endfor %}</p>
{% if live %}
  {% if live.problem %}<p class="note" id="live">{{ live.problem }}</p>
  {% else %}{{ table(live_rows, id="live") }}{% endif %}
{% else %}
<p class="note" id="live">From the store alone: checkpoints in progress and aborted ones are not shown
(they are on the job's control topic, which this page reads when it reaches Kafka).</p>
{% endif %}
{% if chart %}<h2>Duration and size</h2>{{ chart|safe }}{% endif %}
<h2>History</h2>
{{ table(history, link=link, id="history") }}
{% for line in below %}<p class="problem">{{ line }}</p>{% endfor %}
<p class="note">verifies: every part of a checkpoint is there with its size (its own page checks every
checksum too); kinds: what the tasks' checkpoints turned out to be; in flight: offsets of unaligned channel state.</p>
{% endif %}
{% endblock %}
"""

_CHECKPOINT = """\
{% extends "base.html" %}
{% from "parts.html" import parts %}
{% block main %}
<h1>Checkpoint {{ checkpoint_id }}</h1>
<p class="note">
  <a href="{{ url_for('state', checkpoint_id=checkpoint_id) }}">operator state</a> &middot;
  <a href="{{ url_for('channels', checkpoint_id=checkpoint_id) }}">channel state</a> &middot;
  every part read and checked against its checksum
</p>
<div id="detail">{{ parts(items) }}</div>
{% endblock %}
"""

_STATE = """\
{% extends "base.html" %}
{% from "parts.html" import parts %}
{% block main %}
<h1>{{ heading }}</h1>
<p class="note"><a href="{{ url_for('checkpoint', checkpoint_id=checkpoint_id) }}">checkpoint {{ checkpoint_id }}</a>
  &middot; {{ what }}</p>
<form method="get">
  <label>task <select name="task"><option value="">every task</option>
    {% for t in tasks %}<option{{ ' selected' if t == task }}>{{ t }}</option>{% endfor %}</select></label>
  {% if tables is not none %}
  <label>table <select name="table"><option value="">every table</option>
    {% for t in tables %}<option{{ ' selected' if t == table }}>{{ t }}</option>{% endfor %}</select></label>
  {% endif %}
  <label>rows <input name="rows" type="number" min="1" max="1000" value="{{ rows }}"></label>
  <button>show</button>
</form>
<div id="state">{{ parts(items) }}</div>
{% endblock %}
"""

_GENERATIONS = """\
{% extends "base.html" %}
{% from "parts.html" import table %}
{% block main %}
<h1>Generations and restores of job {{ job }}</h1>
{{ table(generations, id="generations") }}
<p class="note">Each restore starts a generation; the store records when, from which checkpoint (or from the
beginning, when none verified), whether that checkpoint was rescaled, the tasks per stage, and why the job
restored (a generation recorded by an older version has no cause).  The job runner's log says more: which
worker died, and its last lines.</p>
{% if drill %}<p class="note">The latest drill of this job says which failure each of its restores followed:
<a href="{{ url_for('reports') }}">reports</a>.</p>{% endif %}
{% endblock %}
"""

_REPORTS = """\
{% extends "base.html" %}
{% block main %}
<h1>Reports</h1>
<h2>The latest drill of job {{ job }}</h2>
{% if drill %}
<p id="drill-verdict"><span class="badge">{{ 'passed' if drill.passed else 'FAILED' }}</span> {{ drill.verdict }}</p>
<p class="note">{{ drill.directory }}</p>
<pre class="report">{{ drill.text }}</pre>
{% else %}
<p class="note">No `spark-abs drill` report of this job under {{ home }}/drills.</p>
{% endif %}
<h2>The latest side-by-side comparison</h2>
{% if compare %}
<p class="note">`spark-abs compare`, {{ compare.directory }}</p>
{% if compare.text %}<pre class="report">{{ compare.text }}</pre>{% endif %}
{% for name in compare.charts %}<img class="chart" alt="{{ name }}" src="{{ url_for('compare_chart', name=name) }}">
{% endfor %}
{% else %}
<p class="note">No `spark-abs compare` run with charts under {{ home }}/runs.</p>
{% endif %}
{% endblock %}
"""

_ERROR = """\
{% extends "base.html" %}
{% block main %}
<h1>{{ title }}</h1>
<p class="problem" id="error">{{ message }}</p>
{% endblock %}
"""

TEMPLATES = {
    "base.html": _BASE,
    "parts.html": _PARTS,
    "overview.html": _OVERVIEW,
    "checkpoint.html": _CHECKPOINT,
    "state.html": _STATE,
    "generations.html": _GENERATIONS,
    "reports.html": _REPORTS,
    "error.html": _ERROR,
}
