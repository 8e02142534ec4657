"""The peer in the benchmark: Quix Streams restoring the same changelog with its own recovery.

Quix writes its own changelog format: every record carries a `__column_family__` header naming the
store's column family. So this script first copies warmstore's changelog, record for record and
partition for partition, into QUIX_TOPIC with that header (untimed), then times Quix's
`RecoveryManager` driving one `RocksDBStorePartition` per partition (Quix's default options) from
empty to the high watermark.

The mock cluster answers CreateTopics and DescribeConfigs with timeouts, so the harness creates
QUIX_TOPIC through the broker process, and the topic is registered with Quix's `TopicManager` as a
changelog directly rather than through `changelog_topic()`, which would ask the broker for configs.

usage: python3 bench/quix_peer.py --bootstrap HOST:PORT --topic TOPIC --quix-topic QUIX_TOPIC
                                  --partitions P --state-dir DIR [--compression CODEC]
prints: `records=N seconds=S` on the last line.
"""

import argparse
import logging
import os
import sys
import time

from confluent_kafka import Consumer as RawConsumer
from confluent_kafka import Producer, TopicPartition
from quixstreams.kafka import Consumer
from quixstreams.models.topics import Topic, TopicAdmin, TopicConfig, TopicManager, TopicType
from quixstreams.state.metadata import CHANGELOG_CF_MESSAGE_HEADER
from quixstreams.state.recovery import RecoveryManager
from quixstreams.state.rocksdb import RocksDBStorePartition

GROUP = "bench"
STREAM = "bench-source"
STORE = "default"


def copy_changelog(bootstrap, source, target, partitions, compression):
    """Copies every record of `source` into `target` with Quix's column family header, produced
    with the codec `source` was produced with."""
    reader = RawConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench-quix-copy",
            "enable.auto.commit": False,
        }
    )
    writer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 50,
            "batch.size": 1 << 20,
            "queue.buffering.max.kbytes": 1 << 20,
            "compression.type": compression,
        }
    )
    ends = {}
    for p in range(partitions):
        low, high = reader.get_watermark_offsets(TopicPartition(source, p), timeout=10)
        if high > low:
            ends[p] = high
    reader.assign([TopicPartition(source, p, 0) for p in ends])
    header = [(CHANGELOG_CF_MESSAGE_HEADER, STORE.encode())]
    while ends:
        for m in reader.consume(10000, timeout=1):
            if m.error():
                raise RuntimeError(m.error())
            while True:
                try:
                    writer.produce(
                        target, key=m.key(), value=m.value(), partition=m.partition(), headers=header
                    )
                    break
                except BufferError:
                    # The producer's queue is full (a real broker acknowledges slower than the
                    # mock cluster): wait for deliveries to make room.
                    writer.poll(0.1)
            if m.offset() + 1 >= ends.get(m.partition(), 0):
                ends.pop(m.partition(), None)
            writer.poll(0)
    writer.flush(60)
    reader.close()


def main():
    args = argparse.ArgumentParser()
    args.add_argument("--bootstrap", required=True)
    args.add_argument("--topic", required=True)
    args.add_argument("--quix-topic", required=True)
    args.add_argument("--partitions", type=int, required=True)
    args.add_argument("--state-dir", required=True)
    args.add_argument("--compression", default="none")
    a = args.parse_args()
    logging.getLogger("quixstreams").setLevel(logging.WARNING)

    admin = TopicAdmin(broker_address=a.bootstrap)
    topics = TopicManager(topic_admin=admin, consumer_group=GROUP)
    changelog = a.quix_topic
    topics.changelog_topics.setdefault(STREAM, {})[STORE] = Topic(
        name=changelog,
        key_serializer="bytes",
        value_serializer="bytes",
        key_deserializer="bytes",
        value_deserializer="bytes",
        create_config=TopicConfig(num_partitions=a.partitions, replication_factor=1),
        topic_type=TopicType.CHANGELOG,
    )
    copy_changelog(a.bootstrap, a.topic, changelog, a.partitions, a.compression)
    # What Quix will read: the copy as the broker keeps it.
    probe = RawConsumer({"bootstrap.servers": a.bootstrap, "group.id": "bench-quix-probe"})
    records = 0
    for p in range(a.partitions):
        low, high = probe.get_watermark_offsets(TopicPartition(changelog, p), timeout=10)
        records += high - low
    probe.close()

    started = time.perf_counter()
    consumer = Consumer(
        broker_address=a.bootstrap,
        consumer_group=GROUP,
        auto_offset_reset="earliest",
        auto_commit_enable=False,
    )
    consumer.assign([TopicPartition(changelog, p, 0) for p in range(a.partitions)])
    recovery = RecoveryManager(consumer=consumer, topic_manager=topics)
    stores = []
    for p in range(a.partitions):
        store = RocksDBStorePartition(path=os.path.join(a.state_dir, str(p)))
        stores.append(store)
        recovery.assign_partition(
            topic=STREAM,
            partition=p,
            committed_offsets={},
            store_partitions={STORE: store},
        )
    recovery.do_recovery()
    seconds = time.perf_counter() - started
    # Quix must have read every partition to its end, or the figure means nothing.
    for p, store in enumerate(stores):
        _, high = consumer.get_watermark_offsets(TopicPartition(changelog, p), timeout=10)
        offset = store.get_changelog_offset()
        if high > 0 and (offset is None or offset + 1 < high):
            raise RuntimeError(f"partition {p}: Quix stopped at {offset}, the end is {high}")
    for store in stores:
        store.close()
    consumer.close()
    print(f"records={records} seconds={seconds:.3f}")


if __name__ == "__main__":
    sys.exit(main())
