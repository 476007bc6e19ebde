use std::time::Duration;

#[derive(Debug, jobq::Classify)]
pub enum MailError {
    #[jobq(permanent, retry_after = after)]
    Gone { after: Duration },
}

fn main() {}
