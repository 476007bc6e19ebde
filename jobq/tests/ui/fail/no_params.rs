use jobq::JobError;

#[derive(serde::Serialize, serde::Deserialize)]
pub struct Args {
    pub invoice_id: i64,
}

#[jobq::job]
async fn send() -> Result<(), JobError> {
    Ok(())
}

fn main() {}
