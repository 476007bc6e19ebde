use std::time::Duration;

#[derive(Debug, jobq::Classify)]
pub enum MailError {
    #[jobq(retriable)]
    Down,
    #[jobq(permanent, reason = "gone")]
    Gone { after: Duration },
}

fn main() {}
