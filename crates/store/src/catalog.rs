//! The catalog: the set of model cards a store knows by id.
//!
//! The built-in catalog is compiled in from `cards/*.toml`, so a binary always knows its models
//! and their hashes without reading anything at run time. Tests and embedders can build their
//! own catalog from cards with [`Catalog::from_cards`].

use crate::card::ModelCard;
use crate::error::{Error, Result};

/// Id of the model used when none is named: small, fast, and what the end-to-end tests run on.
pub const DEFAULT_MODEL_ID: &str = "smollm2-135m-instruct";

/// The built-in cards, in listing order: (origin for error messages, TOML text).
const BUILTIN_CARDS: &[(&str, &str)] = &[
    (
        "built-in cards/smollm2-135m-instruct.toml",
        include_str!("../cards/smollm2-135m-instruct.toml"),
    ),
    (
        "built-in cards/gemma3-270m.toml",
        include_str!("../cards/gemma3-270m.toml"),
    ),
];

/// Returns [`DEFAULT_MODEL_ID`].
pub fn default_model_id() -> &'static str {
    DEFAULT_MODEL_ID
}

/// An ordered set of model cards with unique ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Catalog {
    cards: Vec<ModelCard>,
}

impl Catalog {
    /// The cards compiled into this crate.
    ///
    /// # Panics
    /// Never in a tested build: the cards are constants and `builtin_cards_are_valid` parses
    /// every one of them, so a broken card fails the test suite, not a user.
    pub fn builtin() -> Catalog {
        match Self::parse_builtin() {
            Ok(catalog) => catalog,
            Err(e) => panic!("built-in model catalog is invalid: {e}"),
        }
    }

    fn parse_builtin() -> Result<Catalog> {
        let cards = BUILTIN_CARDS
            .iter()
            .map(|(origin, text)| ModelCard::from_toml(text, origin))
            .collect::<Result<Vec<_>>>()?;
        Catalog::from_cards(cards)
    }

    /// Builds a catalog, validating each card and rejecting duplicate ids.
    pub fn from_cards(cards: Vec<ModelCard>) -> Result<Catalog> {
        for (i, card) in cards.iter().enumerate() {
            card.validate(&format!("'{}'", card.id))?;
            if cards[..i].iter().any(|c| c.id == card.id) {
                return Err(Error::DuplicateId(card.id.clone()));
            }
        }
        Ok(Catalog { cards })
    }

    /// Appends one card (an import), validating it and rejecting a duplicate id.
    pub(crate) fn add(&mut self, card: ModelCard) -> Result<()> {
        card.validate(&format!("'{}'", card.id))?;
        if self.get(&card.id).is_some() {
            return Err(Error::DuplicateId(card.id));
        }
        self.cards.push(card);
        Ok(())
    }

    /// The card with this id, if any.
    pub fn get(&self, id: &str) -> Option<&ModelCard> {
        self.cards.iter().find(|c| c.id == id)
    }

    /// The card with this id, or [`Error::UnknownModel`] listing the known ids.
    pub fn card(&self, id: &str) -> Result<&ModelCard> {
        self.get(id).ok_or_else(|| Error::UnknownModel {
            id: id.to_string(),
            known: self.ids().map(str::to_string).collect(),
        })
    }

    /// All cards, in catalog order.
    pub fn cards(&self) -> &[ModelCard] {
        &self.cards
    }

    /// All ids, in catalog order.
    pub fn ids(&self) -> impl Iterator<Item = &str> {
        self.cards.iter().map(|c| c.id.as_str())
    }
}

impl Default for Catalog {
    fn default() -> Self {
        Catalog::builtin()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn builtin_cards_are_valid() {
        let catalog = Catalog::parse_builtin().unwrap();
        assert_eq!(catalog.cards().len(), BUILTIN_CARDS.len());
        for card in catalog.cards() {
            assert_eq!(card.sha256.len(), 64);
            assert!(card.sha256.bytes().all(|b| b.is_ascii_hexdigit()));
            // The origin file is named after the id, so a card is easy to find from an error.
            assert!(
                BUILTIN_CARDS
                    .iter()
                    .any(|(origin, _)| origin.ends_with(&format!("/{}.toml", card.id)))
            );
        }
    }

    #[test]
    fn builtin_ids_are_unique_and_include_the_default() {
        let catalog = Catalog::builtin();
        let mut ids: Vec<_> = catalog.ids().collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), catalog.cards().len());
        let default = catalog.card(default_model_id()).unwrap();
        assert_eq!(default.architecture, "llama");
        assert_eq!(default.quant, "Q4_1");
        assert_eq!(default.size, 98_362_432);
    }

    #[test]
    fn gemma_parts_are_in_file_order() {
        let catalog = Catalog::builtin();
        let gemma = catalog.card("gemma3-270m").unwrap();
        let suffixes: Vec<_> = gemma
            .source
            .parts
            .iter()
            .map(|p| &p.member[p.member.len() - 6..])
            .collect();
        assert_eq!(suffixes, ["part00", "part01", "part02", "part03"]);
        assert_eq!(gemma.size, 253_113_024);
    }

    #[test]
    fn unknown_id_error_lists_known_ids() {
        let err = Catalog::builtin().card("llama-7b").unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("llama-7b"), "{msg}");
        assert!(msg.contains("smollm2-135m-instruct"), "{msg}");
        assert!(msg.contains("gemma3-270m"), "{msg}");
    }

    #[test]
    fn duplicate_ids_are_rejected() {
        let card = Catalog::builtin().cards()[0].clone();
        let err = Catalog::from_cards(vec![card.clone(), card]).unwrap_err();
        assert!(matches!(err, Error::DuplicateId(id) if id == DEFAULT_MODEL_ID));
    }
}
