//! Human-friendly durations (`10s`, `500ms`) and sizes (`64MiB`) for the config file.

use serde::{de, Deserialize, Deserializer};
use std::fmt;
use std::time::Duration;

/// A byte count written as `64MiB`, `512KiB`, `1GB` or a bare integer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

/// A duration written as `10s`, `500ms`, `2m`, `1h`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct HumanDuration(pub Duration);

/// Why a size or a duration in the config cannot be read; each quotes what was written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnitError {
    #[error("`{0}` is not a size; write it like 64MiB or 65536")]
    NotASize(String),
    #[error("`{text}` has an unknown size unit `{unit}`; use B, KiB, MiB, GiB, KB, MB or GB")]
    SizeUnit { text: String, unit: String },
    #[error("`{0}` is too large")]
    TooLarge(String),
    #[error("`{0}` is not a duration; write it like 10s or 500ms")]
    NotADuration(String),
    #[error("`{0}` needs a unit: ms, s, m or h")]
    NoDurationUnit(String),
    #[error("`{text}` has an unknown duration unit `{unit}`; use ms, s, m or h")]
    DurationUnit { text: String, unit: String },
}

/// Parses `64MiB`-style sizes. Binary (KiB) and decimal (KB) suffixes are both accepted because
/// users copy values from both RocksDB (binary) and Kafka (decimal) docs.
pub fn parse_size(text: &str) -> Result<u64, UnitError> {
    let text = text.trim();
    let (number, unit) = number_and_unit(text).ok_or_else(|| UnitError::NotASize(text.into()))?;
    let multiplier: u64 = match unit {
        "" | "B" => 1,
        "KB" | "kB" => 1_000,
        "KiB" => 1 << 10,
        "MB" => 1_000_000,
        "MiB" => 1 << 20,
        "GB" => 1_000_000_000,
        "GiB" => 1 << 30,
        other => {
            return Err(UnitError::SizeUnit {
                text: text.to_string(),
                unit: other.to_string(),
            })
        }
    };
    number
        .checked_mul(multiplier)
        .ok_or_else(|| UnitError::TooLarge(text.to_string()))
}

/// Parses `10s`-style durations; a unit is required so `10` is never mistaken for ms or s.
pub fn parse_duration(text: &str) -> Result<Duration, UnitError> {
    let text = text.trim();
    let (number, unit) =
        number_and_unit(text).ok_or_else(|| UnitError::NotADuration(text.into()))?;
    let duration = match unit {
        "ms" => Duration::from_millis(number),
        "s" => Duration::from_secs(number),
        "m" | "min" => Duration::from_secs(number.saturating_mul(60)),
        "h" => Duration::from_secs(number.saturating_mul(3600)),
        "" => return Err(UnitError::NoDurationUnit(text.to_string())),
        other => {
            return Err(UnitError::DurationUnit {
                text: text.to_string(),
                unit: other.to_string(),
            })
        }
    };
    Ok(duration)
}

/// The leading digits of `text` as a number, and the unit after them without its spaces; `None`
/// when there are no digits or they overflow.
fn number_and_unit(text: &str) -> Option<(u64, &str)> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    Some((digits.parse().ok()?, unit.trim()))
}

/// YAML gives either a number or a string; both are accepted for sizes.
#[derive(Deserialize)]
#[serde(untagged)]
enum NumberOrText {
    Number(u64),
    Text(String),
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match NumberOrText::deserialize(deserializer)? {
            NumberOrText::Number(n) => Ok(ByteSize(n)),
            NumberOrText::Text(t) => parse_size(&t).map(ByteSize).map_err(de::Error::custom),
        }
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        parse_duration(&text)
            .map(HumanDuration)
            .map_err(de::Error::custom)
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}B", self.0)
    }
}

impl schemars::JsonSchema for ByteSize {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ByteSize".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "bytes, or a size such as 64MiB (B, KiB, MiB, GiB, KB, MB, GB)",
            "anyOf": [
                {"type": "integer", "minimum": 0},
                {"type": "string", "pattern": r"^\s*[0-9]+\s*(B|KB|kB|KiB|MB|MiB|GB|GiB)?\s*$"}
            ]
        })
    }
}

impl schemars::JsonSchema for HumanDuration {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "HumanDuration".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "a duration with its unit: ms, s, m or h (10s, 500ms)",
            "type": "string",
            "pattern": r"^\s*[0-9]+\s*(ms|s|m|min|h)\s*$"
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("512KiB"), Ok(512 << 10));
        assert_eq!(parse_size("1GB"), Ok(1_000_000_000));
        assert_eq!(parse_size("65536"), Ok(65536));
        assert_eq!(parse_size(" 2 MiB "), Ok(2 << 20));
        assert!(parse_size("64XB")
            .unwrap_err()
            .to_string()
            .contains("unknown size unit"));
        assert!(parse_size("MiB").is_err());
        assert!(parse_size("-1MiB").is_err());
        assert!(parse_size("99999999999999999999GiB").is_err());
        assert!(parse_size("18446744073709551615GiB").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert!(parse_duration("10")
            .unwrap_err()
            .to_string()
            .contains("needs a unit"));
        assert!(parse_duration("10 parsecs").is_err());
        assert!(parse_duration("fast").is_err());
    }
}
