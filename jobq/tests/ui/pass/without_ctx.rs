//! A handler may leave out the context; it stays callable on its own in unit tests.
use jobq::JobError;

#[derive(serde::Serialize, serde::Deserialize)]
pub struct Args {
    pub n: i64,
}

#[jobq::job]
async fn check_positive(args: Args) -> Result<(), JobError> {
    if args.n > 0 {
        Ok(())
    } else {
        Err(JobError::permanent("not_positive", "n must be positive"))
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    assert!(rt.block_on(check_positive(Args { n: 1 })).is_ok());
    assert!(rt.block_on(check_positive(Args { n: -1 })).is_err());
    let _ = CheckPositive;
}
