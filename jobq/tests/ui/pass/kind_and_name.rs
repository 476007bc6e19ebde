//! `kind = "..."` sets the stored kind; `name = Ident` the generated type's name.
use jobq::{Job, JobContext, JobError};

#[derive(serde::Serialize, serde::Deserialize)]
pub struct Args {
    pub id: i64,
}

#[jobq::job(kind = "mail.welcome.v2", name = WelcomeMail)]
async fn welcome(_ctx: JobContext, _args: Args) -> Result<(), JobError> {
    Ok(())
}

fn main() {
    assert_eq!(WelcomeMail::KIND, "mail.welcome.v2");
    assert!(jobq::registered_jobs().iter().any(|h| h.kind() == "mail.welcome.v2"));
}
