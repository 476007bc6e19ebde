use std::time::Duration;

#[derive(Debug, jobq::Classify)]
pub enum MailError {
    RateLimited {
        #[jobq(retry_after)]
        wait: Duration,
    },
}

fn main() {}
