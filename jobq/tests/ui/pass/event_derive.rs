use jobq::outbox::EventData;
use serde::Serialize;

#[derive(Serialize, jobq::Event)]
#[event(type = "order_paid", aggregate = order_id, version = version)]
struct OrderPaid {
    order_id: i64,
    version: i32,
    amount_cents: i64,
}

#[derive(Serialize, jobq::Event)]
#[event(type = "stock_moved", aggregate = sku, version = seq, aggregate_type = "item")]
struct StockMoved {
    sku: String,
    seq: u32,
}

#[derive(Serialize, jobq::Event)]
#[event(type = "newsletter_sent")]
struct NewsletterSent {
    id: u64,
}

fn main() {
    let paid = OrderPaid { order_id: 123, version: 7, amount_cents: 990 };
    assert_eq!(OrderPaid::EVENT_TYPE, "order_paid");
    assert_eq!(paid.aggregate(), Some(("order", "123".to_owned(), 7)));
    let _ = paid.amount_cents;
    let moved = StockMoved { sku: "A-1".into(), seq: 3 };
    assert_eq!(moved.aggregate(), Some(("item", "A-1".to_owned(), 3)));
    assert_eq!(moved.to_event().event_type(), "stock_moved");
    assert_eq!(NewsletterSent { id: 1 }.aggregate(), None);
}
