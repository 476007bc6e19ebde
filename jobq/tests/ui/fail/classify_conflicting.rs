use std::time::Duration;

#[derive(Debug, jobq::Classify)]
pub enum MailError {
    #[jobq(retryable, permanent)]
    Down,
    #[jobq(cancel, retryable)]
    Stop { after: Duration },
}

fn main() {}
