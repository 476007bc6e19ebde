use jobq::JobContext;

#[derive(serde::Serialize, serde::Deserialize)]
pub struct Args {
    pub invoice_id: i64,
}

#[jobq::job]
async fn send(_ctx: JobContext, _args: Args) {}

#[jobq::job]
async fn send_option(_ctx: JobContext, _args: Args) -> Option<()> {
    None
}

fn main() {}
