CREATE TABLE customers (id bigint PRIMARY KEY, email text NOT NULL);
