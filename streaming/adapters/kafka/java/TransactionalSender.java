package spark_abs;

import java.io.BufferedInputStream;
import java.io.DataInputStream;
import java.io.EOFException;
import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.PrintStream;
import java.io.StringReader;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.FinalizedVersionRange;
import org.apache.kafka.clients.admin.ProducerState;
import org.apache.kafka.clients.admin.DescribeProducersResult.PartitionProducerState;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.InvalidProducerEpochException;
import org.apache.kafka.common.errors.ProducerFencedException;
import org.apache.kafka.common.header.internals.RecordHeader;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * The Kafka sink's transactions, written by Kafka's own Java client (the
 * second transaction protocol, KIP-890, where the broker has it).  One
 * process per sink task, driven over stdin by streaming.adapters.kafka.transactions:
 *
 * <ul>
 *   <li>first the producer's properties (Java properties text, length-prefixed);
 *       it answers {@code READY} once {@code initTransactions} fenced any older
 *       instance of its transactional id;
 *   <li>{@code T}: a transaction of N records, each topic, partition (-1: the
 *       partitioner's), key, value (-1: null) and headers, each sent as it is
 *       read; it answers {@code OK}, {@code FENCED <why>} (the broker refused
 *       the producer's epoch: a newer instance took over) or {@code ERROR <why>}
 *       (aborted);
 *   <li>{@code F}: the finalized {@code transaction.version} of the cluster;
 *   <li>{@code P}: the producers of a partition, {@code id:epoch} each;
 *   <li>{@code Q} or the end of stdin: close.
 * </ul>
 *
 * Every answer is one line on stdout; the client's own logging goes to stderr.
 */
public final class TransactionalSender {
    private TransactionalSender() {}

    public static void main(String[] args) throws IOException {
        DataInputStream in = new DataInputStream(new BufferedInputStream(System.in, 1 << 16));
        PrintStream out = new PrintStream(new FileOutputStream(FileDescriptor.out), true, StandardCharsets.UTF_8);
        System.setOut(System.err); // nothing but answers on stdout
        Properties props = new Properties();
        props.load(new StringReader(text(in)));
        Properties admin = (Properties) props.clone();
        for (String producerOnly : List.of(
                "transactional.id", "enable.idempotence", "acks", "linger.ms", "delivery.timeout.ms",
                "max.block.ms", "transaction.timeout.ms", "key.serializer", "value.serializer")) {
            admin.remove(producerOnly);
        }
        props.put("key.serializer", ByteArraySerializer.class.getName());
        props.put("value.serializer", ByteArraySerializer.class.getName());
        long blockMs = Long.parseLong(props.getProperty("max.block.ms", "60000"));
        KafkaProducer<byte[], byte[]> producer;
        try {
            producer = new KafkaProducer<>(props);
            producer.initTransactions();
        } catch (KafkaException e) {
            out.println("ERROR " + oneLine(e));
            return;
        }
        out.println("READY");
        boolean fenced = false;
        try {
            while (true) {
                int op;
                try {
                    op = in.readUnsignedByte();
                } catch (EOFException e) {
                    break;
                }
                if (op == 'Q') {
                    break;
                } else if (op == 'T') {
                    // records are sent as they are read, so a transaction takes no more memory than the
                    // producer's buffer; after a failure the rest are read and dropped, so the request
                    // always ends where the next one starts
                    int count = in.readInt();
                    KafkaException failed = null;
                    if (!fenced) {
                        try {
                            producer.beginTransaction();
                        } catch (KafkaException e) {
                            failed = e;
                        }
                    }
                    for (int i = 0; i < count; i++) {
                        ProducerRecord<byte[], byte[]> record = record(in);
                        if (failed == null && !fenced) {
                            try {
                                producer.send(record);
                            } catch (KafkaException e) {
                                failed = e;
                            }
                        }
                    }
                    if (fenced) {
                        out.println("FENCED a newer instance of this transactional id took over");
                        continue;
                    }
                    if (failed == null) {
                        try {
                            producer.commitTransaction();
                            out.println("OK");
                            continue;
                        } catch (KafkaException e) {
                            failed = e;
                        }
                    }
                    if (failed instanceof ProducerFencedException || failed instanceof InvalidProducerEpochException) {
                        fenced = true;
                        out.println("FENCED " + oneLine(failed) + " (the broker refused this producer's epoch: "
                                + "a newer instance of the transactional id started, or the transaction ran "
                                + "past transaction.timeout.ms and was aborted)");
                        continue;
                    }
                    try {
                        producer.abortTransaction();
                    } catch (KafkaException ignored) {
                        // the failure itself is the answer; the next instance fences what is left
                    }
                    out.println("ERROR " + oneLine(failed));
                } else if (op == 'F') {
                    out.println(transactionVersion(admin, blockMs));
                } else if (op == 'P') {
                    out.println(producers(admin, new TopicPartition(text(in), in.readInt()), blockMs));
                } else {
                    out.println("ERROR unknown request " + op);
                    break;
                }
            }
        } finally {
            producer.close(Duration.ofMillis(Math.min(blockMs, 5_000)));
        }
    }

    private static ProducerRecord<byte[], byte[]> record(DataInputStream in) throws IOException {
        String topic = text(in);
        int partition = in.readInt();
        byte[] key = bytes(in);
        byte[] value = bytes(in);
        int headers = in.readInt();
        List<org.apache.kafka.common.header.Header> named = new ArrayList<>(headers);
        for (int h = 0; h < headers; h++) {
            named.add(new RecordHeader(text(in), bytes(in)));
        }
        return new ProducerRecord<>(topic, partition < 0 ? null : partition, key, value, named);
    }

    private static String transactionVersion(Properties admin, long blockMs) {
        try (Admin client = Admin.create(admin)) {
            Map<String, FinalizedVersionRange> features =
                    client.describeFeatures().featureMetadata().get(blockMs, TimeUnit.MILLISECONDS).finalizedFeatures();
            FinalizedVersionRange range = features.get("transaction.version");
            return "FEATURE " + (range == null ? 0 : range.maxVersionLevel());
        } catch (Exception e) {
            return "ERROR " + oneLine(e);
        }
    }

    private static String producers(Properties admin, TopicPartition partition, long blockMs) {
        try (Admin client = Admin.create(admin)) {
            PartitionProducerState state =
                    client.describeProducers(List.of(partition)).partitionResult(partition).get(blockMs, TimeUnit.MILLISECONDS);
            StringBuilder said = new StringBuilder("PRODUCERS");
            Collection<ProducerState> producers = state.activeProducers();
            for (ProducerState producer : producers) {
                said.append(' ').append(producer.producerId()).append(':').append(producer.producerEpoch());
            }
            return said.toString();
        } catch (Exception e) {
            return "ERROR " + oneLine(e);
        }
    }

    private static String text(DataInputStream in) throws IOException {
        byte[] raw = bytes(in);
        return raw == null ? "" : new String(raw, StandardCharsets.UTF_8);
    }

    private static byte[] bytes(DataInputStream in) throws IOException {
        int length = in.readInt();
        if (length < 0) {
            return null;
        }
        byte[] raw = new byte[length];
        in.readFully(raw);
        return raw;
    }

    private static String oneLine(Throwable e) {
        StringBuilder said = new StringBuilder(e.getClass().getSimpleName() + ": " + e.getMessage());
        for (Throwable cause = e.getCause(); cause != null && cause != cause.getCause(); cause = cause.getCause()) {
            said.append(" (").append(cause.getClass().getSimpleName()).append(": ").append(cause.getMessage()).append(')');
        }
        return said.toString().replace('\n', ' ');
    }
}
