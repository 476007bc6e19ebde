//! `Runtime::builder(..).register::<J>()` still works next to the inventory registration
//! (the same type twice is fine).
use jobq::{JobContext, JobError};

#[derive(serde::Serialize, serde::Deserialize)]
pub struct Args {
    pub id: i64,
}

#[jobq::job]
async fn send(_ctx: JobContext, _args: Args) -> Result<(), JobError> {
    Ok(())
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let pool = sqlx::PgPool::connect_lazy("postgres://localhost/none").unwrap();
        let runtime = jobq::Runtime::builder(pool)
            .register::<Send>()
            .build()
            .unwrap();
        assert_eq!(runtime.kinds().collect::<Vec<_>>(), ["send"]);
        let pool = sqlx::PgPool::connect_lazy("postgres://localhost/none").unwrap();
        let explicit_only = jobq::Runtime::builder(pool)
            .auto_register(false)
            .register::<Send>()
            .build()
            .unwrap();
        assert_eq!(explicit_only.kinds().count(), 1);
    });
}
