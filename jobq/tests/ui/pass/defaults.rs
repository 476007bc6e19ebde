//! `#[job]` with no keys: kind = the function's name, type = its PascalCase, the `Job`
//! trait's defaults for everything else, no idempotency key.
use jobq::{Job, JobContext, JobError, RetryPolicy};

#[derive(serde::Serialize, serde::Deserialize)]
pub struct Args {
    pub id: i64,
}

/// Sends the welcome email.
#[jobq::job]
pub async fn send_welcome_email(_ctx: JobContext, _args: Args) -> Result<(), JobError> {
    Ok(())
}

fn main() {
    assert_eq!(SendWelcomeEmail::KIND, "send_welcome_email");
    assert_eq!(SendWelcomeEmail::QUEUE, "default");
    assert_eq!(SendWelcomeEmail::PRIORITY, 0);
    assert_eq!(SendWelcomeEmail::RETRY, RetryPolicy::default());
    assert_eq!(SendWelcomeEmail::LEASE, std::time::Duration::from_secs(60));
    assert_eq!(SendWelcomeEmail::TIMEOUT, None);
    assert_eq!(SendWelcomeEmail::idempotency_key(&Args { id: 1 }), None);
    // The generated type is a plain unit struct: Debug, Clone, Copy.
    let job = SendWelcomeEmail;
    let _copy = job;
    assert_eq!(format!("{job:?}"), "SendWelcomeEmail");
    // It is registered with the runtime through inventory.
    assert!(
        jobq::registered_jobs()
            .iter()
            .any(|h| h.kind() == "send_welcome_email" && h.type_name().ends_with("SendWelcomeEmail"))
    );
}
