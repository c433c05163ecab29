//! Two crates registering the same provider id: lookup fails naming both.

fn build(
    _t: &dyn spec_core::Target,
    _o: &spec_core::ProviderOptions,
) -> Result<Box<dyn spec_core::DraftProvider>, spec_core::SpecError> {
    Err(spec_core::SpecError::Model("never built".into()))
}

spec_core::inventory::submit! {
    spec_core::ProviderRegistration {
        id: third_party_provider::ID,
        description: "a clash on purpose",
        crate_name: "clashing-crate",
        build,
        request_options: &[],
    }
}

#[test]
fn duplicate_ids_are_an_error_naming_both_crates() {
    let err = spec_core::resolve(third_party_provider::ID)
        .expect_err("must fail")
        .to_string();
    assert!(
        err.contains("clashing-crate") && err.contains("third-party-provider"),
        "{err}"
    );
}
