#[jobq::job(kind = "send")]
pub struct Send;

fn main() {}
