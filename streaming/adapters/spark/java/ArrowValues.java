package spark_abs;

import java.io.ByteArrayInputStream;
import java.io.Serializable;
import java.util.List;

import org.apache.arrow.compression.CommonsCompressionFactory;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.apache.arrow.vector.FieldVector;
import org.apache.arrow.vector.TimeStampVector;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.ipc.ArrowStreamReader;
import org.apache.arrow.vector.types.pojo.ArrowType;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.types.TimestampNTZType;
import org.apache.spark.sql.types.TimestampType;
import org.apache.spark.sql.util.ArrowUtils;
import org.apache.spark.sql.vectorized.ArrowColumnVector;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * The rows of Kafka records whose values are Arrow IPC streams (compressed as a stage writes them),
 * read in the layout {@link Runs#numberArrow} gives. A value that cannot be read (not an IPC
 * stream, a column missing or of another type, more Arrow memory than the cap) makes its record
 * one row marked as not read, with its raw columns: Python says why.
 */
final class ArrowValues implements Serializable {
    private static final long serialVersionUID = 1L;
    // the output row: topic, partition, offset, control, event time, not read, key, value, headers,
    // timestamp, decoded row, run, records
    private static final int WIDTH = 13;

    private final StructType decoded;
    private final long maxDecodedBytes;

    ArrowValues(StructType decoded, long maxDecodedBytes) {
        this.decoded = decoded;
        this.maxDecodedBytes = maxDecodedBytes;
    }

    /** The rows of {@code record} (topic, partition, offset, control, key, value, headers, timestamp). */
    void rowsOf(InternalRow record, boolean control, int run, List<InternalRow> out) {
        if (!control) {
            int before = out.size();
            try {
                read(record, run, out);
                return;
            } catch (Exception unreadable) { // Arrow's cap included (OutOfMemoryException); a full heap is not the value's fault
                out.subList(before, out.size()).clear();
            }
        }
        Object[] values = keyed(record, run);
        values[3] = control;
        values[5] = !control;
        values[6] = record.isNullAt(4) ? null : record.getBinary(4);
        values[7] = record.isNullAt(5) ? null : record.getBinary(5);
        values[8] = record.isNullAt(6) ? null : record.getArray(6).copy();
        values[9] = record.isNullAt(7) ? null : record.getLong(7);
        out.add(new GenericInternalRow(values));
    }

    private static Object[] keyed(InternalRow record, int run) {
        Object[] values = new Object[WIDTH];
        values[0] = record.getUTF8String(0).clone();
        values[1] = record.getInt(1);
        values[2] = record.getLong(2);
        values[11] = run;
        return values;
    }

    private void read(InternalRow record, int run, List<InternalRow> out) throws Exception {
        if (record.isNullAt(5)) {
            throw new IllegalArgumentException("no value");
        }
        byte[] value = record.getBinary(5);
        StructField[] fields = decoded.fields();
        try (BufferAllocator allocator = new RootAllocator(maxDecodedBytes);
             ArrowStreamReader reader =
                 new ArrowStreamReader(new ByteArrayInputStream(value), allocator, CommonsCompressionFactory.INSTANCE)) {
            VectorSchemaRoot root = reader.getVectorSchemaRoot();
            java.util.List<ColumnVector> columns = new java.util.ArrayList<>();
            int[] place = new int[fields.length];
            TimeStampVector[] times = new TimeStampVector[fields.length];
            long[] scale = new long[fields.length];
            for (int j = 0; j < fields.length; j++) {
                FieldVector vector = root.getVector(fields[j].name());
                if (vector == null) {
                    throw new IllegalArgumentException("no column " + fields[j].name());
                }
                DataType want = fields[j].dataType();
                boolean time = want instanceof TimestampType || want instanceof TimestampNTZType;
                if (time && vector instanceof TimeStampVector) {
                    times[j] = (TimeStampVector) vector;
                    scale[j] = micros(((ArrowType.Timestamp) vector.getField().getType()).getUnit());
                } else if (ArrowUtils.fromArrowField(vector.getField()).sameType(want)) {
                    place[j] = columns.size();
                    columns.add(new ArrowColumnVector(vector));
                } else {
                    throw new IllegalArgumentException("column " + fields[j].name() + " is not " + want);
                }
            }
            ColumnVector[] vectors = columns.toArray(new ColumnVector[0]);
            while (reader.loadNextBatch()) {
                int rows = root.getRowCount();
                ColumnarBatch batch = new ColumnarBatch(vectors, rows);
                for (int i = 0; i < rows; i++) {
                    // copied: strings and nested values leave the Arrow memory, which closes below
                    InternalRow copied = batch.getRow(i).copy();
                    Object[] row = new Object[fields.length];
                    for (int j = 0; j < fields.length; j++) {
                        if (times[j] != null) {
                            row[j] = times[j].isNull(i) ? null : at(times[j].get(i), scale[j]);
                        } else if (!copied.isNullAt(place[j])) {
                            row[j] = copied.get(place[j], fields[j].dataType());
                        }
                    }
                    Object[] values = keyed(record, run);
                    values[3] = false;
                    values[5] = false;
                    values[10] = new GenericInternalRow(row);
                    out.add(new GenericInternalRow(values));
                }
            }
        }
    }

    /** How many microseconds one unit is; negative: how many units one microsecond is. */
    private static long micros(org.apache.arrow.vector.types.TimeUnit unit) {
        switch (unit) {
            case SECOND:
                return 1_000_000L;
            case MILLISECOND:
                return 1_000L;
            case MICROSECOND:
                return 1L;
            default:
                return -1_000L;
        }
    }

    private static long at(long value, long scale) {
        return scale > 0 ? Math.multiplyExact(value, scale) : Math.floorDiv(value, -scale);
    }
}
