//! Two `#[jobq::job]`s claiming one kind in one binary: the runtime refuses to build and
//! names both types. (A test binary of its own: `inventory` is binary-wide, so this
//! duplicate would break every other test sharing the binary.)

use jobq::{JobContext, JobError};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Args {
    id: i64,
}

#[jobq::job(kind = "send_invoice")]
async fn send_invoice(_ctx: JobContext, args: Args) -> Result<(), JobError> {
    let _ = args.id;
    Ok(())
}

mod legacy {
    use super::{Args, JobError};

    #[jobq::job(kind = "send_invoice", name = LegacySendInvoice)]
    pub(crate) async fn send_invoice_v1(_args: Args) -> Result<(), JobError> {
        Ok(())
    }
}

#[tokio::test]
async fn two_jobs_with_one_kind_refuse_to_build() -> anyhow::Result<()> {
    // Building reads no rows: a lazy pool is enough.
    let pool = sqlx::PgPool::connect_lazy(&jobq_testing::database_url())?;
    let Err(err) = jobq::Runtime::builder(pool).build() else {
        anyhow::bail!("a runtime with two handlers for one kind was built");
    };
    let jobq::Error::DuplicateKind {
        kind,
        first,
        second,
    } = &err
    else {
        anyhow::bail!("expected DuplicateKind, got {err}");
    };
    assert_eq!(kind, "send_invoice");
    let types = [*first, *second];
    assert!(
        types.contains(&"macros_duplicate_kind::SendInvoice")
            && types.contains(&"macros_duplicate_kind::legacy::LegacySendInvoice"),
        "{types:?}"
    );
    let message = err.to_string();
    assert!(
        message.contains("LegacySendInvoice") && message.contains("::SendInvoice"),
        "{message}"
    );
    Ok(())
}
