-- An application's own migration, run with sqlx::migrate! beside jobq's.
CREATE TABLE invoices (id bigint PRIMARY KEY, status text NOT NULL);
