//! The dashboard's static files, embedded in the binary. There is no
//! front-end build: plain HTML, CSS, one ES module and an SVG icon, written
//! by hand. The server answers a fixed list of paths; anything else is not
//! an asset, so no request path can reach the file system.
//!
//! The page needs nothing from elsewhere (no CDN, no web fonts, no inline
//! script or style), so it runs under the server's `default-src 'self'`.

const HTML: &str = "text/html; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";
const SVG: &str = "image/svg+xml";

/// One embedded file.
pub struct Asset {
    pub path: &'static str,
    pub content_type: &'static str,
    pub body: &'static [u8],
}

const INDEX: &[u8] = include_bytes!("assets/index.html");

/// Every path served. `/` and `/index.html` are the single page; the
/// dashboard's routes are in the URL's fragment, which never reaches the
/// server.
const ASSETS: &[Asset] = &[
    Asset {
        path: "/",
        content_type: HTML,
        body: INDEX,
    },
    Asset {
        path: "/index.html",
        content_type: HTML,
        body: INDEX,
    },
    Asset {
        path: "/assets/app.js",
        content_type: JS,
        body: include_bytes!("assets/app.js"),
    },
    Asset {
        path: "/assets/app.css",
        content_type: CSS,
        body: include_bytes!("assets/app.css"),
    },
    Asset {
        path: "/assets/favicon.svg",
        content_type: SVG,
        body: include_bytes!("assets/favicon.svg"),
    },
];

/// The dashboard file at `path` (the request path, without its query), or
/// `None` when `path` is not one of them.
pub fn asset(path: &str) -> Option<&'static Asset> {
    ASSETS.iter().find(|a| a.path == path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(path: &str) -> &'static str {
        let body = asset(path)
            .unwrap_or_else(|| panic!("{path} is served"))
            .body;
        std::str::from_utf8(body).unwrap_or_else(|e| panic!("{path} is UTF-8: {e}"))
    }

    /// The values of `attr="..."` in `html`.
    fn attribute_values<'a>(html: &'a str, attr: &str) -> Vec<&'a str> {
        let needle = format!(" {attr}=\"");
        html.match_indices(&needle)
            .filter_map(|(at, _)| {
                let rest = &html[at + needle.len()..];
                rest.find('"').map(|end| &rest[..end])
            })
            .collect()
    }

    /// Every local file the page and its stylesheet and script refer to.
    fn references() -> Vec<String> {
        let html = text("/index.html");
        let mut refs: Vec<String> = ["src", "href"]
            .iter()
            .flat_map(|attr| attribute_values(html, attr))
            .filter(|v| !v.starts_with('#'))
            .map(str::to_string)
            .collect();
        // ES module imports and CSS url()s would be fetched too.
        let js = text("/assets/app.js");
        for line in js.lines().filter(|l| l.trim_start().starts_with("import ")) {
            if let Some(from) = line.split(['\'', '"']).nth(1) {
                refs.push(from.to_string());
            }
        }
        let css = text("/assets/app.css");
        for (at, _) in css.match_indices("url(") {
            let rest = &css[at + 4..];
            let end = rest.find(')').expect("url( is closed");
            refs.push(rest[..end].trim_matches(['\'', '"']).to_string());
        }
        refs.sort();
        refs.dedup();
        refs
    }

    #[test]
    fn every_file_the_page_refers_to_is_served() {
        let refs = references();
        assert!(refs.contains(&"/assets/app.js".to_string()), "{refs:?}");
        assert!(refs.contains(&"/assets/app.css".to_string()), "{refs:?}");
        for r in &refs {
            assert!(
                r.starts_with('/') && !r.starts_with("//"),
                "{r}: the page loads only its own files (CSP default-src 'self')"
            );
            assert!(asset(r).is_some(), "{r} is referred to but not served");
        }
    }

    #[test]
    fn nothing_is_served_that_the_page_does_not_use() {
        let refs = references();
        for a in ASSETS {
            let used = a.path == "/" || a.path == "/index.html" || refs.iter().any(|r| r == a.path);
            assert!(used, "{} is served but nothing refers to it", a.path);
        }
    }

    #[test]
    fn only_the_fixed_list_is_served() {
        for path in [
            "",
            "/assets/",
            "/assets",
            "/assets/../assets/app.js",
            "/assets/./app.js",
            "//assets/app.js",
            "/assets/app.js/",
            "/assets/APP.JS",
            "/assets/app.js%00",
            "/assets/%2e%2e/Cargo.toml",
            "/../Cargo.toml",
            "/assets.rs",
            "/src/assets/app.js",
            "/index.htm",
            "/favicon.ico",
        ] {
            assert!(asset(path).is_none(), "{path:?} must not be served");
        }
        let Asset {
            content_type, body, ..
        } = asset("/").expect("the page");
        assert_eq!(*content_type, HTML);
        assert_eq!(asset("/index.html").map(|a| a.body), Some(*body));
        assert_eq!(asset("/assets/app.js").map(|a| a.content_type), Some(JS));
        assert_eq!(asset("/assets/app.css").map(|a| a.content_type), Some(CSS));
        assert_eq!(
            asset("/assets/favicon.svg").map(|a| a.content_type),
            Some(SVG)
        );
    }

    #[test]
    fn the_page_has_no_inline_script_or_style() {
        let html = text("/index.html");
        // Every <script> has a src and no body; no <style>, no style="".
        for (at, _) in html.match_indices("<script") {
            let tag_end = at + html[at..].find('>').expect("script tag closes");
            assert!(
                html[at..tag_end].contains(" src=\""),
                "inline <script> at {at}"
            );
            assert!(
                html[tag_end + 1..].starts_with("</script>"),
                "a <script> with a body at {at}"
            );
        }
        assert!(!html.contains("<style"), "inline <style>");
        assert!(!html.contains(" style=\""), "inline style attribute");
        for (at, _) in html.match_indices(" on") {
            let name: String = html[at + 3..]
                .chars()
                .take_while(|c| c.is_ascii_alphabetic())
                .collect();
            assert!(
                !html[at + 3 + name.len()..].starts_with('='),
                "inline event handler on{name}"
            );
        }
        for path in ["/index.html", "/assets/app.js", "/assets/app.css"] {
            // The SVG namespace is a name, not an address that is fetched.
            let t = text(path).replace("'http://www.w3.org/2000/svg'", "");
            assert!(
                !t.contains("http://") && !t.contains("https://"),
                "{path} refers elsewhere"
            );
        }
    }

    #[test]
    fn the_script_never_writes_markup() {
        // Names from the API reach the page as text only.
        let js = text("/assets/app.js");
        for sink in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "eval(",
        ] {
            assert!(!js.contains(sink), "app.js uses {sink}");
        }
    }
}
