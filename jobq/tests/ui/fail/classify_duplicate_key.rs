use std::time::Duration;

#[derive(Debug, jobq::Classify)]
pub enum MailError {
    #[jobq(code = "down", code = "unavailable")]
    Down,
    #[jobq(permanent)]
    #[jobq(permanent)]
    Gone { after: Duration },
}

fn main() {}
