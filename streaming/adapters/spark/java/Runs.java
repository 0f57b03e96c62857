package spark_abs;

import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.NoSuchElementException;

import org.apache.spark.api.java.function.FlatMapFunction;
import org.apache.spark.rdd.RDD;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.JoinedRow;
import org.apache.spark.sql.classic.Dataset;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * Runs of data records between control records, numbered in the one pass Spark makes over a
 * micro-batch of Kafka records (streaming.adapters.spark.stage).
 *
 * <p>The input's first five columns are a record's topic (string), partition (int), offset
 * (long), whether it is a control record (boolean, never null) and its event time in
 * milliseconds (long, null where it has none). Every row comes out with two more columns: its
 * run ({@code _abs_run}: how many control records of its channel came before it in the
 * partition) and {@code _abs_records}, null on a record. After the last data record of each run
 * comes a marker row: the channel, the run's last offset, its highest event time, the run and
 * {@code _abs_records}, the run's number of data records; its other columns are null.
 *
 * <p>Spark's Kafka source reads each channel's offset range in one partition, in offset order;
 * a channel whose offsets go back within a partition fails the task.
 */
public final class Runs {
    public static final String RUN = "_abs_run";
    public static final String RECORDS = "_abs_records";
    public static final String EVENT_TIME = "_abs_event_time";
    public static final String BAD = "_abs_bad";
    public static final String DECODED = "_abs_decoded";
    // numberArrow's optional ninth input column: the record is stale (an older generation wrote it)
    private static final int STALE_AT = 8;

    private Runs() {}

    /** {@code records} numbered by run, with a marker row after each run of data records. */
    public static Dataset<Row> number(Dataset<Row> records) {
        StructType in = records.schema();
        StructType out = in.asNullable().add(RUN, DataTypes.IntegerType, false).add(RECORDS, DataTypes.LongType, true);
        RDD<InternalRow> rows = records.queryExecution().toRdd();
        RDD<InternalRow> numbered = rows.toJavaRDD().mapPartitions(new Numbering(in.length()), true).rdd();
        return records.sparkSession().internalCreateDataFrame(numbered, out, false);
    }

    /**
     * Kafka records whose values are Arrow IPC streams (an internal topic), numbered by run as
     * {@link #number} numbers them, each data record's value read into its rows.
     *
     * <p>The input's columns are topic, partition, offset, whether the record is a control record,
     * then key, value, headers and timestamp. The output has the columns {@link #number} gives
     * after the decoding a stage of Spark code does (topic, partition, offset, control, event time
     * (null), whether the record could not be read, key, value, headers, timestamp, the decoded
     * row, then run and records): a control record or one that could not be read is one row with
     * its raw columns and no decoded row; a data record read is one row per row of its value,
     * without raw columns. A value is read only if its rows have every column of {@code
     * decodedJson} (a Spark struct type, as JSON) with its type (timestamps in any unit), and
     * only within {@code maxDecodedBytes} of Arrow memory, so a small value that would decompress
     * to much more is refused while it is read. Markers count records, not rows. A ninth input
     * column, when there is one, says a data record is stale (written by a generation that failed,
     * after the barrier its channel was restored at): it counts in its run's marker (its position)
     * but gives no rows, as the new generation writes it again.
     */
    public static Dataset<Row> numberArrow(Dataset<Row> records, String decodedJson, long maxDecodedBytes) {
        StructType decoded = (StructType) DataType.fromJson(decodedJson);
        StructType in = records.schema();
        StructType flagged = new StructType()
            .add(in.fields()[0].name(), DataTypes.StringType, true)
            .add(in.fields()[1].name(), DataTypes.IntegerType, true)
            .add(in.fields()[2].name(), DataTypes.LongType, true)
            .add(in.fields()[3].name(), DataTypes.BooleanType, true)
            .add(EVENT_TIME, DataTypes.LongType, true)
            .add(BAD, DataTypes.BooleanType, true)
            .add(in.fields()[4].copy(in.fields()[4].name(), in.fields()[4].dataType(), true, in.fields()[4].metadata()))
            .add(in.fields()[5].copy(in.fields()[5].name(), in.fields()[5].dataType(), true, in.fields()[5].metadata()))
            .add(in.fields()[6].copy(in.fields()[6].name(), in.fields()[6].dataType(), true, in.fields()[6].metadata()))
            .add(in.fields()[7].copy(in.fields()[7].name(), in.fields()[7].dataType(), true, in.fields()[7].metadata()))
            .add(DECODED, decoded, true);
        StructType out = flagged.add(RUN, DataTypes.IntegerType, false).add(RECORDS, DataTypes.LongType, true);
        RDD<InternalRow> rows = records.queryExecution().toRdd();
        RDD<InternalRow> numbered = rows.toJavaRDD()
            .mapPartitions(new Numbering(flagged.length(), new ArrowValues(decoded, maxDecodedBytes)), true)
            .rdd();
        return records.sparkSession().internalCreateDataFrame(numbered, out, false);
    }

    private static final class Numbering implements FlatMapFunction<Iterator<InternalRow>, InternalRow> {
        private static final long serialVersionUID = 1L;
        private final int width;
        private final ArrowValues values;

        Numbering(int width) {
            this(width, null);
        }

        Numbering(int width, ArrowValues values) {
            this.width = width;
            this.values = values;
        }

        @Override
        public Iterator<InternalRow> call(Iterator<InternalRow> rows) {
            return new Numbered(rows, width, values);
        }
    }

    /** One channel's place in a partition. */
    private static final class Channel {
        final UTF8String topic;
        final int partition;
        int run;
        long records;
        long lastData = -1;
        long lastSeen = -1;
        boolean timed;
        long maxTime;

        Channel(UTF8String topic, int partition) {
            this.topic = topic;
            this.partition = partition;
        }
    }

    private static final class Numbered implements Iterator<InternalRow> {
        private final Iterator<InternalRow> rows;
        private final int width;
        private final List<Channel> channels = new ArrayList<>();
        private final ArrayDeque<InternalRow> markers = new ArrayDeque<>();
        private final GenericInternalRow extra = new GenericInternalRow(2);
        private final JoinedRow joined = new JoinedRow();
        private final ArrowValues values;
        private final List<InternalRow> expanded = new ArrayList<>();
        private Channel current;
        private boolean ended;

        Numbered(Iterator<InternalRow> rows, int width, ArrowValues values) {
            this.rows = rows;
            this.width = width;
            this.values = values;
        }

        @Override
        public boolean hasNext() {
            if (!markers.isEmpty() || rows.hasNext()) {
                return true;
            }
            if (!ended) {
                ended = true;
                for (Channel channel : channels) {
                    endRun(channel);
                }
            }
            return !markers.isEmpty();
        }

        @Override
        public InternalRow next() {
            // a data record whose value holds no rows gives none: read on (its run's marker counts it)
            while (hasNext()) {
                if (!markers.isEmpty()) {
                    return markers.poll();
                }
                InternalRow row = rows.next();
                Channel channel = channelOf(row);
                long offset = row.getLong(2);
                if (offset <= channel.lastSeen) {
                    throw new IllegalStateException(
                        "spark-abs: the records of " + channel.topic + "/" + channel.partition
                            + " came out of offset order (" + offset + " after " + channel.lastSeen
                            + "); a stage query reads each channel in one partition");
                }
                channel.lastSeen = offset;
                int run = channel.run;
                boolean control = row.getBoolean(3);
                if (control) {
                    endRun(channel);
                    channel.run++;
                } else {
                    channel.records++;
                    channel.lastData = offset;
                    if (values == null && !row.isNullAt(4)) {
                        long time = row.getLong(4);
                        if (!channel.timed || time > channel.maxTime) {
                            channel.maxTime = time;
                            channel.timed = true;
                        }
                    }
                }
                if (values == null) {
                    extra.setInt(0, run);
                    extra.setNullAt(1);
                    return joined.apply(row, extra);
                }
                if (!control && row.numFields() > STALE_AT && !row.isNullAt(STALE_AT) && row.getBoolean(STALE_AT)) {
                    continue; // written by a generation that failed, after its channel's restored barrier: counted, not read
                }
                expanded.clear();
                values.rowsOf(row, control, run, expanded);
                markers.addAll(expanded);
            }
            throw new NoSuchElementException();
        }

        private Channel channelOf(InternalRow row) {
            UTF8String topic = row.getUTF8String(0);
            int partition = row.getInt(1);
            if (current != null && current.partition == partition && current.topic.equals(topic)) {
                return current;
            }
            for (Channel channel : channels) {
                if (channel.partition == partition && channel.topic.equals(topic)) {
                    current = channel;
                    return channel;
                }
            }
            current = new Channel(topic.clone(), partition);
            channels.add(current);
            return current;
        }

        private void endRun(Channel channel) {
            if (channel.records == 0) {
                return;
            }
            Object[] values = new Object[width + 2];
            values[0] = channel.topic;
            values[1] = channel.partition;
            values[2] = channel.lastData;
            values[3] = false;
            values[4] = channel.timed ? channel.maxTime : null;
            values[width] = channel.run;
            values[width + 1] = channel.records;
            markers.add(new GenericInternalRow(values));
            channel.records = 0;
            channel.timed = false;
        }
    }
}
