//! Leaf constants every room may use: the sizes and names enqueue accepts and the
//! shortest lease. `jobq-macros` checks its own copies against these at compile time.

use std::time::Duration;

/// The largest payload (serialized JSON) accepted by enqueue: 1 MiB.
pub const MAX_PAYLOAD_BYTES: usize = 1 << 20;
/// The longest kind name accepted.
pub const MAX_KIND_LEN: usize = 200;
/// The longest queue name accepted.
pub const MAX_QUEUE_LEN: usize = 100;
/// The longest idempotency key accepted.
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 500;
/// The shortest lease a job type may have: heartbeats cannot keep a shorter one alive.
pub const MIN_LEASE: Duration = Duration::from_millis(300);
