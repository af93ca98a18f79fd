//! The key template: `"order:{<id>}:<item.sku>"`.
//!
//! `<name>` is a parameter, `<name.field.0>` a field path into one; `<<` and `>>` are a
//! literal `<` and `>`; everything else, `{` and `}` included (Redis Cluster hash tags),
//! is literal, except that `{name}` naming a parameter, the `format!` habit, is refused
//! (`braced_names` finds them; `expand` knows the parameters). Stable Rust cannot point
//! inside a string literal, so every error spans the whole literal and says which part of
//! it is wrong.

use syn::LitStr;

use crate::errors::Errors;

/// One piece of a template.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Part {
    /// Literal text, already unescaped (`<<` is `<` here).
    Text(String),
    Placeholder(Placeholder),
}

/// `<root.field.0>`
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Placeholder {
    /// As written between the angle brackets, for messages.
    pub text: String,
    /// The parameter: an identifier or `self`.
    pub root: String,
    /// Field names or tuple indices, in order.
    pub fields: Vec<Field>,
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Field {
    Named(String),
    Index(u32),
}

/// Splits the template into parts; reports every malformed placeholder.
pub(crate) fn parse(lit: &LitStr, errors: &mut Errors) -> Vec<Part> {
    match parse_str(&lit.value()) {
        Ok(parts) => parts,
        Err(messages) => {
            for message in messages {
                errors.push(syn::Error::new(lit.span(), message));
            }
            Vec::new()
        }
    }
}

/// The string-level parser, separate from spans so it can be unit tested.
pub(crate) fn parse_str(template: &str) -> Result<Vec<Part>, Vec<String>> {
    let mut parts = Vec::new();
    let mut errors = Vec::new();
    let mut text = String::new();
    let mut chars = template.char_indices().peekable();
    if template.is_empty() {
        errors.push("the key is empty: give the lock a name, e.g. \"order:<id>\"".to_string());
    }
    while let Some((start, c)) = chars.next() {
        match c {
            '<' if chars.peek().is_some_and(|&(_, next)| next == '<') => {
                chars.next();
                text.push('<');
            }
            '>' if chars.peek().is_some_and(|&(_, next)| next == '>') => {
                chars.next();
                text.push('>');
            }
            '>' => errors.push(format!(
                "unmatched `>` at byte {start} of the key: write `>>` for a literal `>`"
            )),
            '<' => {
                let mut inner = String::new();
                let mut closed = false;
                for (_, c) in chars.by_ref() {
                    if c == '>' {
                        closed = true;
                        break;
                    }
                    inner.push(c);
                }
                if !closed {
                    errors.push(format!(
                        "unclosed `<` at byte {start} of the key: end the placeholder with `>` \
                         (`<{inner}>`), or write `<<` for a literal `<`"
                    ));
                    break;
                }
                match placeholder(&inner) {
                    Ok(placeholder) => {
                        if !text.is_empty() {
                            parts.push(Part::Text(std::mem::take(&mut text)));
                        }
                        parts.push(Part::Placeholder(placeholder));
                    }
                    Err(message) => errors.push(message),
                }
            }
            c => text.push(c),
        }
    }
    if !text.is_empty() {
        parts.push(Part::Text(text));
    }
    if errors.is_empty() {
        Ok(parts)
    } else {
        Err(errors)
    }
}

fn placeholder(inner: &str) -> Result<Placeholder, String> {
    if inner.is_empty() {
        return Err(
            "empty placeholder `<>` in the key: write a parameter name between the \
                    brackets, e.g. `<id>`, or `<<>>` for a literal `<>`"
                .to_string(),
        );
    }
    let invalid = || {
        format!(
            "invalid placeholder `<{inner}>` in the key: write a parameter name or a field path \
             such as `<id>`, `<order.id>`, `<self.id>` or `<pair.0>`, without spaces \
             (`<<` and `>>` are a literal `<` and `>`)"
        )
    };
    let mut segments = inner.split('.');
    let root = segments.next().unwrap_or_default();
    if !is_identifier(root) {
        return Err(invalid());
    }
    let mut fields = Vec::new();
    for segment in segments {
        if is_identifier(segment) && segment != "self" {
            fields.push(Field::Named(segment.to_string()));
        } else if !segment.is_empty()
            && segment.bytes().all(|b| b.is_ascii_digit())
            && (segment == "0" || !segment.starts_with('0'))
        {
            fields.push(Field::Index(segment.parse().map_err(|_| invalid())?));
        } else {
            return Err(invalid());
        }
    }
    Ok(Placeholder {
        text: inner.to_string(),
        root: root.to_string(),
        fields,
    })
}

/// `{id}` in a template: the `format!` habit, literal text here (a hash tag), found so
/// that one naming a parameter can be refused (`expand` knows the parameters).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Braced {
    /// Byte range of the braces and their contents in the template.
    pub range: std::ops::Range<usize>,
    /// What `format!` would have read between them: the name or field path, without a
    /// format spec (`{id:?}` is `id`).
    pub placeholder: Placeholder,
}

/// Every `{name}`, `{name.field}` or `{name:spec}` outside placeholders; `{{name}}`
/// (`format!`'s escape for literal braces) is not one, nor is a tag holding anything else
/// (`{<id>}`, `{tenant-7}`, `{}`).
pub(crate) fn braced_names(template: &str) -> Vec<Braced> {
    let bytes = template.as_bytes();
    let mut out = Vec::new();
    for (open, _) in template.match_indices('{') {
        let rest = &template[open + 1..];
        let Some(len) = rest.find(['{', '}']) else {
            break;
        };
        if rest.as_bytes()[len] == b'{' {
            continue;
        }
        let close = open + 1 + len;
        let escaped = open > 0 && bytes[open - 1] == b'{' && bytes.get(close + 1) == Some(&b'}');
        let inner = &rest[..len];
        let name = inner.split_once(':').map_or(inner, |(name, _)| name);
        if escaped || inner.contains(['<', '>']) {
            continue;
        }
        if let Ok(placeholder) = placeholder(name) {
            out.push(Braced {
                range: open..close + 1,
                placeholder,
            });
        }
    }
    out
}

/// An identifier or keyword (`r#type` is accepted too).
fn is_identifier(s: &str) -> bool {
    let s = s.strip_prefix("r#").unwrap_or(s);
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c == '_' || c.is_alphabetic())
        && chars.all(|c| c == '_' || c.is_alphanumeric())
        && s != "_"
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &str) -> Part {
        Part::Text(s.to_string())
    }

    fn ph(root: &str, fields: Vec<Field>) -> Part {
        let mut text = root.to_string();
        for field in &fields {
            match field {
                Field::Named(name) => text += &format!(".{name}"),
                Field::Index(index) => text += &format!(".{index}"),
            }
        }
        Part::Placeholder(Placeholder {
            text,
            root: root.to_string(),
            fields,
        })
    }

    #[test]
    fn literal_and_placeholders() {
        assert_eq!(
            parse_str("order:{<id>}:<item.sku>").unwrap(),
            vec![
                text("order:{"),
                ph("id", vec![]),
                text("}:"),
                ph("item", vec![Field::Named("sku".into())]),
            ]
        );
        assert_eq!(
            parse_str("<self.pair.0>").unwrap(),
            vec![ph(
                "self",
                vec![Field::Named("pair".into()), Field::Index(0)]
            )]
        );
    }

    #[test]
    fn escapes() {
        assert_eq!(parse_str("a<<b>>c").unwrap(), vec![text("a<b>c")]);
        assert_eq!(
            parse_str("<<<id>>>").unwrap(),
            vec![text("<"), ph("id", vec![]), text(">")]
        );
    }

    #[test]
    fn braced_names_are_the_format_habit() {
        let found = |template: &str| -> Vec<(String, String)> {
            braced_names(template)
                .into_iter()
                .map(|b| (template[b.range].to_string(), b.placeholder.text))
                .collect()
        };
        let pair = |a: &str, b: &str| (a.to_string(), b.to_string());
        assert_eq!(found("order:{id}"), vec![pair("{id}", "id")]);
        assert_eq!(
            found("{order.id}:{self.n}:{id:?}"),
            vec![
                pair("{order.id}", "order.id"),
                pair("{self.n}", "self.n"),
                pair("{id:?}", "id")
            ]
        );
        assert_eq!(found("a{{id}}b{x}"), vec![pair("{x}", "x")]);
        assert_eq!(found("{{a}"), vec![pair("{a}", "a")]);
        for none in [
            "order:{<id>}",
            "{tenant-7}:x",
            "{}",
            "{1}",
            "{a b}",
            "{",
            "}{",
            "{a",
            "<<{x>>}",
        ] {
            assert_eq!(found(none), vec![], "{none}");
        }
    }

    #[test]
    fn errors() {
        assert!(parse_str("").is_err());
        assert!(parse_str("a<>").unwrap_err()[0].contains("empty placeholder"));
        assert!(parse_str("a<id").unwrap_err()[0].contains("unclosed `<`"));
        assert!(parse_str("a>b").unwrap_err()[0].contains("unmatched `>`"));
        assert!(parse_str("<a b>").unwrap_err()[0].contains("invalid placeholder"));
        assert!(parse_str("<a..b>").is_err());
        assert!(parse_str("<a.01>").is_err());
        assert!(parse_str("<1>").is_err());
        assert_eq!(parse_str("<a> <> <b").unwrap_err().len(), 2);
    }
}
