//! The page, embedded: nothing is fetched from outside the replica.

pub const INDEX_HTML: &str = include_str!("assets/index.html");
pub const APP_JS: &str = include_str!("assets/app.js");
pub const APP_CSS: &str = include_str!("assets/app.css");

/// Everything the page loads, in bytes.
pub fn page_weight() -> usize {
    INDEX_HTML.len() + APP_JS.len() + APP_CSS.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_is_small_and_loads_nothing_from_elsewhere() {
        assert!(page_weight() < 200 * 1024, "{} bytes", page_weight());
        for text in [INDEX_HTML, APP_JS, APP_CSS] {
            assert!(!text.contains("http://") && !text.contains("https://"));
        }
        // No inline script or handler: the CSP forbids them.
        assert!(!INDEX_HTML.contains("<script>"));
        assert!(!INDEX_HTML.contains(" on"), "no inline event handlers");
        assert!(!APP_JS.contains("innerHTML"), "values are set as text");
    }
}
