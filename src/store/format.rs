//! The bytes of the `offsets` column family, exactly as Kafka Streams (KIP-1035, Kafka 4.3) writes them,
//! so a warm store can be handed to a Kafka Streams instance and read by the tools users already have.

use std::fmt;

/// Name of the column family that holds applied offsets and the open/closed status.
pub const OFFSETS_CF: &str = "offsets";
/// Key of the open/closed marker in `offsets`.
pub const STATUS_KEY: &[u8] = b"status";
/// `status` while a process has the store open.
pub const STATUS_OPEN: i64 = 1;
/// `status` after a clean close: everything committed and flushed.
pub const STATUS_CLOSED: i64 = 0;

/// A changelog partition. `Display` matches Java's `TopicPartition.toString()`, which is also the
/// offset key in the store.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TopicPartition {
    pub topic: String,
    pub partition: i32,
}

impl TopicPartition {
    pub fn new(topic: impl Into<String>, partition: i32) -> Self {
        Self {
            topic: topic.into(),
            partition,
        }
    }

    /// The key under which this partition's applied offset is stored.
    pub fn offset_key(&self) -> Vec<u8> {
        self.to_string().into_bytes()
    }
}

impl fmt::Display for TopicPartition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.topic, self.partition)
    }
}

/// Java's `LongSerializer`: 8 bytes, big-endian, two's complement.
pub fn encode_i64(value: i64) -> [u8; 8] {
    value.to_be_bytes()
}

/// The inverse of [`encode_i64`]; `None` for anything that is not exactly 8 bytes, which the dirty rules
/// treat as an unreadable offset rather than guessing.
pub fn decode_i64(bytes: &[u8]) -> Option<i64> {
    let array: [u8; 8] = bytes.try_into().ok()?;
    Some(i64::from_be_bytes(array))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offset_key_is_java_topic_partition_to_string() {
        let tp = TopicPartition::new("wordcount-counts-changelog", 3);
        assert_eq!(tp.offset_key(), b"wordcount-counts-changelog-3".to_vec());
        // Topics may contain dashes and dots; Java simply concatenates.
        assert_eq!(
            TopicPartition::new("a.b-c", 12).offset_key(),
            b"a.b-c-12".to_vec()
        );
    }

    #[test]
    fn offsets_are_eight_byte_big_endian_like_java_long_serializer() {
        assert_eq!(encode_i64(0), [0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(encode_i64(1), [0, 0, 0, 0, 0, 0, 0, 1]);
        assert_eq!(encode_i64(258), [0, 0, 0, 0, 0, 0, 1, 2]);
        assert_eq!(encode_i64(-1), [0xff; 8]);
        assert_eq!(encode_i64(0x0102_0304_0506_0708), [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(decode_i64(&[0, 0, 0, 0, 0, 0, 1, 2]), Some(258));
        assert_eq!(decode_i64(&[0xff; 8]), Some(-1));
    }

    #[test]
    fn anything_but_eight_bytes_is_unreadable() {
        assert_eq!(decode_i64(b""), None);
        assert_eq!(decode_i64(b"1234567"), None);
        assert_eq!(decode_i64(b"123456789"), None);
    }
}
