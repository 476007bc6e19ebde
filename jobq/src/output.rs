//! Recorded output: what a handler's `Ok(value)` returned, stored with the job as
//! `jobs.output` (River's `RecordOutput`, Oban Pro's recorded jobs), bounded in size.

use serde::Serialize;

/// The largest recorded output, serialized: 64 KiB. A larger one fails the attempt
/// permanently with code `output_too_large` (its effects happened: store large results
/// elsewhere and return a reference).
pub const MAX_OUTPUT_BYTES: usize = 64 << 10;

/// Why a value cannot be an output: a stable code and a message.
pub(crate) type Refused = (&'static str, String);

/// Serializes `value` as an output, or says why it cannot be one.
pub(crate) fn encode<T: Serialize + ?Sized>(value: &T) -> Result<String, Refused> {
    let text = serde_json::to_string(value).map_err(|e| {
        (
            "invalid_output",
            format!("the handler's output does not serialize as JSON: {e}"),
        )
    })?;
    if text.len() > MAX_OUTPUT_BYTES {
        return Err((
            "output_too_large",
            format!(
                "the handler's output is {} bytes serialized; the limit is {MAX_OUTPUT_BYTES} (store large results elsewhere and return a reference)",
                text.len()
            ),
        ));
    }
    if crate::store::has_escaped_nul(&text) {
        return Err((
            "invalid_output",
            "the handler's output contains a NUL character, which jsonb cannot store".to_owned(),
        ));
    }
    Ok(text)
}
