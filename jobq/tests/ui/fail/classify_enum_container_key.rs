#[derive(Debug, jobq::Classify)]
#[jobq(permanent)]
pub enum MailError {
    Down,
}

fn main() {}
