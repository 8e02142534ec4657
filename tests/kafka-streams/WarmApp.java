// A Kafka Streams application that materialises two stores from one input topic: `ts-store`, a
// timestamped key-value store (what the DSL makes by default), and `kv-store`, a plain key-value
// store. The tests warm its state directory with warmstore, then start it and read what it says:
//
//   restored <store> <records>          what its StateRestoreListener counted, per store
//   running_ms <ms>                      from start() to RUNNING
//   ts-store <key> <value> <timestamp>   every entry, through interactive queries
//   kv-store <key> <value>
//
// Usage: java -cp <classpath> WarmApp.java <bootstrap> <state.dir> <application.id> <guarantee> <input>
// Runs until RUNNING, prints, closes cleanly (so the stores are closed as Kafka Streams closes
// them), leaves its group and exits 0; exits 1 on an uncaught exception in a stream thread.

import java.time.Duration;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.CloseOptions;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StoreQueryParameters;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.processor.StateRestoreListener;
import org.apache.kafka.streams.state.KeyValueIterator;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.QueryableStoreTypes;
import org.apache.kafka.streams.state.ReadOnlyKeyValueStore;
import org.apache.kafka.streams.state.Stores;
import org.apache.kafka.streams.state.ValueAndTimestamp;

public class WarmApp {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0];
        String stateDir = args[1];
        String applicationId = args[2];
        String guarantee = args[3];
        String input = args[4];

        Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, applicationId);
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(StreamsConfig.STATE_DIR_CONFIG, stateDir);
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, guarantee);
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 1);
        props.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 1);
        props.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.String().getClass());
        props.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, Serdes.String().getClass());
        props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0);

        StreamsBuilder builder = new StreamsBuilder();
        KStream<String, String> stream = builder.stream(input);
        stream.toTable(Materialized.<String, String, KeyValueStore<Bytes, byte[]>>as("ts-store"));
        stream.toTable(Materialized.<String, String>as(Stores.persistentKeyValueStore("kv-store")));

        Map<String, AtomicLong> restored = new ConcurrentHashMap<>();
        restored.put("ts-store", new AtomicLong());
        restored.put("kv-store", new AtomicLong());
        KafkaStreams streams = new KafkaStreams(builder.build(), props);
        streams.setGlobalStateRestoreListener(new StateRestoreListener() {
            public void onRestoreStart(TopicPartition tp, String store, long start, long end) {
                System.err.println("restore start " + store + " " + tp + " " + start + ".." + end);
            }

            public void onBatchRestored(TopicPartition tp, String store, long batchEnd, long n) {
                restored.computeIfAbsent(store, s -> new AtomicLong()).addAndGet(n);
            }

            public void onRestoreEnd(TopicPartition tp, String store, long total) {
                System.err.println("restore end " + store + " " + tp + " " + total);
            }
        });
        CountDownLatch running = new CountDownLatch(1);
        CountDownLatch failed = new CountDownLatch(1);
        streams.setStateListener((now, before) -> {
            if (now == KafkaStreams.State.RUNNING) {
                running.countDown();
            }
            if (now == KafkaStreams.State.ERROR) {
                failed.countDown();
            }
        });
        streams.setUncaughtExceptionHandler(e -> {
            e.printStackTrace();
            failed.countDown();
            return org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler
                .StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });

        long started = System.nanoTime();
        streams.start();
        while (!running.await(100, TimeUnit.MILLISECONDS)) {
            if (failed.getCount() == 0) {
                streams.close(Duration.ofSeconds(30));
                System.exit(1);
            }
        }
        long runningMs = (System.nanoTime() - started) / 1_000_000;

        for (Map.Entry<String, AtomicLong> e : new TreeMap<>(restored).entrySet()) {
            System.out.println("restored " + e.getKey() + " " + e.getValue().get());
        }
        System.out.println("running_ms " + runningMs);

        ReadOnlyKeyValueStore<String, ValueAndTimestamp<String>> timestamped = streams.store(
            StoreQueryParameters.fromNameAndType("ts-store", QueryableStoreTypes.timestampedKeyValueStore()));
        try (KeyValueIterator<String, ValueAndTimestamp<String>> all = timestamped.all()) {
            while (all.hasNext()) {
                KeyValue<String, ValueAndTimestamp<String>> kv = all.next();
                System.out.println("ts-store " + kv.key + " " + kv.value.value() + " " + kv.value.timestamp());
            }
        }
        ReadOnlyKeyValueStore<String, String> plain = streams.store(
            StoreQueryParameters.fromNameAndType("kv-store", QueryableStoreTypes.keyValueStore()));
        try (KeyValueIterator<String, String> all = plain.all()) {
            while (all.hasNext()) {
                KeyValue<String, String> kv = all.next();
                System.out.println("kv-store " + kv.key + " " + kv.value);
            }
        }
        System.out.flush();
        // Leave the group, so the next run of the same application starts at once instead of
        // waiting for this member's session to time out (the timings above stay comparable).
        streams.close(CloseOptions.groupMembershipOperation(CloseOptions.GroupMembershipOperation.LEAVE_GROUP)
            .withTimeout(Duration.ofSeconds(60)));
        System.exit(failed.getCount() == 0 ? 1 : 0);
    }
}
