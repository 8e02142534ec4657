//! Taking a partition's fetched records in batches, through librdkafka's batch consume.
//!
//! rust-rdkafka hands out one message per poll of a partition queue, and each poll reads the clock
//! twice (its own deadline, and librdkafka's): `clock_gettime` was 5% of a restore's CPU in
//! profiles. `rd_kafka_consume_batch_queue` takes up to a batch from the same queue with one clock
//! read, and moves the consumer's position past the batch (and past transaction markers) just as
//! a poll does.
//!
//! The queue handle here is a second reference to the partition's fetch queue, which the caller
//! has split off the consumer's main queue (`split_partition_queue`), so records reach no other
//! queue.

use rdkafka::bindings as rdsys;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use std::ffi::CString;
use std::ptr::NonNull;
use std::sync::Arc;

/// Most messages taken from librdkafka in one call: a commit budget can be overshot by this many
/// records at most, since a taken message is always applied.
pub const MAX_TAKEN: usize = 256;

/// A fetched partition's queue, taken from in batches.
pub struct BatchQueue {
    queue: NonNull<rdsys::rd_kafka_queue_t>,
    /// The queue belongs to this consumer's handle, which must outlive it.
    _consumer: Arc<dyn std::any::Any + Send + Sync>,
}

// SAFETY: librdkafka's queues are thread-safe; the handle is only a reference counted pointer.
unsafe impl Send for BatchQueue {}
unsafe impl Sync for BatchQueue {}

/// One message as librdkafka delivered it, borrowed for the time of the callback.
pub enum Fetched<'a> {
    Record {
        offset: i64,
        key: Option<&'a [u8]>,
        value: Option<&'a [u8]>,
        /// Milliseconds since the epoch, when the record has a timestamp.
        timestamp: Option<i64>,
    },
    /// A consume error, as rust-rdkafka's poll would report it.
    Error(KafkaError),
}

impl BatchQueue {
    /// `None` when librdkafka has no queue for the partition (an unknown topic name).
    pub fn new<C: ConsumerContext + 'static>(
        consumer: &Arc<BaseConsumer<C>>,
        topic: &str,
        partition: i32,
    ) -> Option<Self> {
        let topic = CString::new(topic).ok()?;
        // SAFETY: the client pointer is valid while the consumer lives, and this keeps it alive.
        let queue = unsafe {
            rdsys::rd_kafka_queue_get_partition(
                consumer.client().native_ptr(),
                topic.as_ptr(),
                partition,
            )
        };
        Some(BatchQueue {
            queue: NonNull::new(queue)?,
            _consumer: consumer.clone(),
        })
    }

    /// Takes what is queued now, up to `max` messages (at most `MAX_TAKEN`), without waiting, and
    /// hands each to `apply` in offset order. Returns how many were taken: 0 when the queue was
    /// empty. Every message taken is handed over, even after `apply` asks to stop, since librdkafka
    /// has already moved the position past it; `apply` returns false to have the rest skipped.
    pub fn take(&self, max: usize, mut apply: impl FnMut(Fetched<'_>) -> bool) -> usize {
        let mut messages = [std::ptr::null_mut::<rdsys::rd_kafka_message_t>(); MAX_TAKEN];
        let want = max.clamp(1, MAX_TAKEN);
        // SAFETY: the queue is valid (we hold a reference) and the array has room for `want`.
        let taken = unsafe {
            rdsys::rd_kafka_consume_batch_queue(self.queue.as_ptr(), 0, messages.as_mut_ptr(), want)
        };
        // With a queue handle librdkafka returns a count, never -1 (that is for its legacy topic
        // API); errors of the fetch arrive as messages and go to `apply`.
        let taken = usize::try_from(taken).unwrap_or(0);
        let mut going = true;
        for &message in &messages[..taken] {
            // Destroys the message when this iteration ends, whatever `apply` does.
            let message = Message(message);
            if going {
                going = apply(message.fetched());
            }
        }
        taken
    }
}

impl Drop for BatchQueue {
    fn drop(&mut self) {
        // SAFETY: the reference taken in `new`, released once.
        unsafe { rdsys::rd_kafka_queue_destroy(self.queue.as_ptr()) }
    }
}

/// A message owned until dropped.
struct Message(*mut rdsys::rd_kafka_message_t);

impl Message {
    fn fetched(&self) -> Fetched<'_> {
        // SAFETY: librdkafka returned a valid message, alive until `drop`.
        let m = unsafe { &*self.0 };
        if m.err != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            let code = RDKafkaErrorCode::from(m.err);
            return Fetched::Error(if code == RDKafkaErrorCode::PartitionEOF {
                KafkaError::PartitionEOF(m.partition)
            } else {
                KafkaError::MessageConsumption(code)
            });
        }
        // SAFETY: the pointers and lengths are the message's own, valid while it is.
        let slice = |data: *mut std::ffi::c_void, len: usize| {
            (!data.is_null()).then(|| unsafe { std::slice::from_raw_parts(data as *const u8, len) })
        };
        let mut kind = rdsys::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE;
        // SAFETY: a valid message, and a place for the timestamp's type.
        let timestamp = unsafe { rdsys::rd_kafka_message_timestamp(self.0, &mut kind) };
        Fetched::Record {
            offset: m.offset,
            key: slice(m.key, m.key_len),
            value: slice(m.payload, m.len),
            // As rust-rdkafka reads it: -1 stands for no timestamp too.
            timestamp: (kind != rdsys::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE
                && timestamp != -1)
                .then_some(timestamp),
        }
    }
}

impl Drop for Message {
    fn drop(&mut self) {
        // SAFETY: taken from librdkafka by `take`, destroyed once.
        unsafe { rdsys::rd_kafka_message_destroy(self.0) }
    }
}
