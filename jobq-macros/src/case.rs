//! Case conversions for generated names: `send_invoice` → `SendInvoice` (the job type),
//! `RateLimited` → `rate_limited` (a variant's default error code).

/// `send_invoice` → `SendInvoice`; `send_invoice_v2` → `SendInvoiceV2`.
pub(crate) fn pascal(snake: &str) -> String {
    let mut out = String::with_capacity(snake.len());
    for word in snake.split('_').filter(|w| !w.is_empty()) {
        let mut chars = word.chars();
        if let Some(first) = chars.next() {
            out.extend(first.to_uppercase());
            out.push_str(chars.as_str());
        }
    }
    out
}

/// `RateLimited` → `rate_limited`; `HTTPError` → `http_error`; `Db` → `db`.
pub(crate) fn snake(pascal: &str) -> String {
    let chars: Vec<char> = pascal.chars().collect();
    let mut out = String::with_capacity(pascal.len() + 4);
    for (i, &c) in chars.iter().enumerate() {
        if c.is_uppercase() {
            let prev = i.checked_sub(1).and_then(|p| chars.get(p)).copied();
            let next = chars.get(i + 1).copied();
            let boundary = match prev {
                None | Some('_') => false,
                Some(p) => {
                    p.is_lowercase()
                        || p.is_ascii_digit()
                        || (p.is_uppercase() && next.is_some_and(char::is_lowercase))
                }
            };
            if boundary {
                out.push('_');
            }
            out.extend(c.to_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pascal_case() {
        assert_eq!(pascal("send_invoice"), "SendInvoice");
        assert_eq!(pascal("send_invoice_v2"), "SendInvoiceV2");
        assert_eq!(pascal("_private_job"), "PrivateJob");
        assert_eq!(pascal("x"), "X");
    }

    #[test]
    fn snake_case() {
        assert_eq!(snake("Db"), "db");
        assert_eq!(snake("RateLimited"), "rate_limited");
        assert_eq!(snake("ProviderDown"), "provider_down");
        assert_eq!(snake("HTTPError"), "http_error");
        assert_eq!(snake("Status404Page"), "status404_page");
        assert_eq!(snake("Io"), "io");
    }
}
