use std::time::Duration;

#[derive(Debug, jobq::Classify)]
pub enum MailError {
    #[jobq(retryable, retry_after = wait)]
    RateLimited { after: Duration, attempts: u32 },
    #[jobq(retry_after = 1)]
    Throttled(Duration),
    #[jobq(retry_after = wait)]
    Down,
}

fn main() {}
