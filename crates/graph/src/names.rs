//! Names given on the command line (models, schedulers, devices, links, cost models) are matched
//! exactly: a near miss is an error that suggests the closest known names, never a silent
//! match of something else. Every registry looks its names up through [`lookup`], so all of
//! them answer a typo the same way.

use std::fmt;

/// A name that is none of the known names of its kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownName {
    /// What was looked up: "model", "scheduler", "device preset", ...
    pub kind: &'static str,
    /// The name as given.
    pub name: String,
    /// The closest known names, best first (empty when none is close).
    pub suggestions: Vec<&'static str>,
    /// Every known name.
    pub known: Vec<&'static str>,
}

impl fmt::Display for UnknownName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown {} '{}'", self.kind, self.name)?;
        let quoted: Vec<String> = self.suggestions.iter().map(|s| format!("'{s}'")).collect();
        match quoted.as_slice() {
            [] => {}
            [one] => write!(f, "; did you mean {one}?")?,
            [init @ .., last] => write!(f, "; did you mean {} or {last}?", init.join(", "))?,
        }
        write!(f, " (known: {})", self.known.join(", "))
    }
}

impl std::error::Error for UnknownName {}

/// A known name and the other names people may try for it. Hints are never matched: they only
/// let an error suggest the right name (`bert` -> `transformer`).
#[derive(Clone, Copy, Debug)]
pub struct Known {
    pub name: &'static str,
    pub hints: &'static [&'static str],
}

impl Known {
    pub const fn plain(name: &'static str) -> Self {
        Known { name, hints: &[] }
    }
}

/// The item whose name is exactly `name`, or an [`UnknownName`] error listing every known name
/// and suggesting the closest ones.
pub fn lookup<'a, T>(
    kind: &'static str,
    name: &str,
    items: &'a [T],
    known: impl Fn(&T) -> Known,
) -> Result<&'a T, UnknownName> {
    items
        .iter()
        .find(|it| known(it).name == name)
        .ok_or_else(|| unknown(kind, name, items.iter().map(known)))
}

/// The error for `name`, which is none of `known`.
pub fn unknown(
    kind: &'static str,
    name: &str,
    known: impl IntoIterator<Item = Known>,
) -> UnknownName {
    let known: Vec<Known> = known.into_iter().collect();
    UnknownName {
        kind,
        name: name.to_string(),
        suggestions: closest(name, &known),
        known: known.iter().map(|k| k.name).collect(),
    }
}

/// Below this similarity a known name is not suggested.
const MIN_SIMILARITY: f64 = 0.8;
/// At most this many suggestions.
const MAX_SUGGESTIONS: usize = 3;

/// The known names closest to `name`, best first: compared in lower case with only letters and
/// digits kept (`InceptionV3` is `inception_v3`), a prefix of at least three characters either
/// way counts as close (`squeeze`, `resnet`), otherwise Jaro-Winkler similarity decides.
fn closest(name: &str, known: &[Known]) -> Vec<&'static str> {
    let want = normalize(name);
    let mut scored: Vec<(f64, &'static str)> = known
        .iter()
        .filter_map(|k| {
            let best = std::iter::once(k.name)
                .chain(k.hints.iter().copied())
                .map(|cand| similarity(&want, &normalize(cand)))
                .fold(0.0, f64::max);
            (best >= MIN_SIMILARITY).then_some((best, k.name))
        })
        .collect();
    // Best first; equal scores keep the registry's order (the sort is stable).
    scored.sort_by(|a, b| b.0.total_cmp(&a.0));
    scored
        .into_iter()
        .take(MAX_SUGGESTIONS)
        .map(|(_, n)| n)
        .collect()
}

fn normalize(s: &str) -> String {
    s.chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect()
}

fn similarity(a: &str, b: &str) -> f64 {
    if a.is_empty() || b.is_empty() {
        return 0.0;
    }
    if a == b {
        return 1.0;
    }
    let (short, long) = if a.len() <= b.len() { (a, b) } else { (b, a) };
    if short.len() >= 3 && long.starts_with(short) {
        return 0.95;
    }
    strsim::jaro_winkler(a, b)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ZOO: &[Known] = &[
        Known {
            name: "inception_v3",
            hints: &["inception"],
        },
        Known::plain("squeezenet"),
        Known::plain("resnet50"),
        Known {
            name: "transformer",
            hints: &["bert"],
        },
    ];

    fn suggest(name: &str) -> Vec<&'static str> {
        lookup("model", name, ZOO, |k| *k)
            .expect_err(name)
            .suggestions
    }

    #[test]
    fn only_the_exact_name_matches() {
        assert_eq!(
            lookup("model", "resnet50", ZOO, |k| *k)
                .map(|k| k.name)
                .ok(),
            Some("resnet50")
        );
        for near in [
            "ResNet50",
            "resnet_50",
            "inception",
            "bert",
            "inceptionv3",
            " resnet50",
        ] {
            assert!(lookup("model", near, ZOO, |k| *k).is_err(), "{near}");
        }
    }

    #[test]
    fn near_misses_suggest_the_closest_names() {
        assert_eq!(suggest("inceptionv3"), ["inception_v3"]);
        assert_eq!(suggest("Inception-V3"), ["inception_v3"]);
        assert_eq!(suggest("resnet"), ["resnet50"]);
        assert_eq!(suggest("squeeze"), ["squeezenet"]);
        assert_eq!(suggest("bert"), ["transformer"]);
        assert_eq!(suggest("sqeezenet"), ["squeezenet"]);
        assert!(suggest("vgg16").is_empty());
    }

    #[test]
    fn the_message_names_the_kind_the_suggestions_and_every_known_name() {
        let e = lookup("model", "resnet", ZOO, |k| *k)
            .expect_err("resnet")
            .to_string();
        assert_eq!(
            e,
            "unknown model 'resnet'; did you mean 'resnet50'? (known: inception_v3, squeezenet, \
             resnet50, transformer)"
        );
        let e = unknown(
            "link preset",
            "nvlink",
            ["nvlink2", "nvlink3", "nvlink4", "pcie4"].map(Known::plain),
        )
        .to_string();
        assert!(
            e.starts_with(
                "unknown link preset 'nvlink'; did you mean 'nvlink2', 'nvlink3' or 'nvlink4'?"
            ),
            "{e}"
        );
        let e = unknown("device preset", "tpu", [Known::plain("h100")]).to_string();
        assert_eq!(e, "unknown device preset 'tpu' (known: h100)");
    }
}
