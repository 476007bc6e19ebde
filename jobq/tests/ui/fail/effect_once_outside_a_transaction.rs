// The effect ledger and complete-in-transaction accept only the caller's transaction: a
// pool would autocommit the ledger row apart from the effect, so it must not compile.
async fn handler(ctx: jobq::JobContext, pool: sqlx::PgPool) -> Result<(), jobq::Error> {
    if ctx.effect_once(&pool, "invoice-42-sent").await? {
        // the effect
    }
    ctx.complete_in_tx(&pool).await?;
    Ok(())
}

// A second `Pool` in the crate graph, so rustc names sqlx's by its full path whatever
// else is linked (the expected message does not depend on the features enabled).
pub struct Pool;

fn main() {
    let _ = handler;
    let _ = Pool;
}
