use std::time::Duration;

#[derive(Debug, jobq::Classify)]
pub enum MailError {
    #[jobq(retryable, code = "rate_limited", retry_after = wait_secs)]
    RateLimited { wait_secs: u64 },
    #[jobq(retry_after = 0)]
    Throttled(Option<Duration>),
}

fn main() {}
