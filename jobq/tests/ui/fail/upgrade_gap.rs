use jobq::JobError;

#[derive(serde::Serialize, serde::Deserialize)]
pub struct V2 {
    pub cents: i64,
}

#[derive(serde::Serialize, serde::Deserialize)]
pub struct Args {
    pub cents: i64,
}

// Version 3 decodes version 2 rows, but nothing upgrades version 1 to `V2`.
#[jobq::upgrade(from = 2)]
fn v2_to_v3(old: V2) -> Args {
    Args { cents: old.cents }
}

#[jobq::job(version = 3)]
pub async fn invoice(args: Args) -> Result<(), JobError> {
    let _ = args.cents;
    Ok(())
}

fn main() {}
