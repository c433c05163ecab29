//! The provider registry. Provider crates register with
//! [`register_provider!`](crate::register_provider) (a `ProviderRegistration`
//! submitted through `inventory`); hosts link the crates they want and
//! resolve a provider by id. A third-party crate adds a provider with no
//! edit here.

use crate::{DraftProvider, ProviderOptions, RequestOption, SpecError, Target};

/// Builds a provider for a loaded target.
pub type BuildFn =
    fn(target: &dyn Target, options: &ProviderOptions) -> Result<Box<dyn DraftProvider>, SpecError>;

/// One provider, as a provider crate registers it.
#[derive(Debug)]
pub struct ProviderRegistration {
    /// The id requests select it by.
    pub id: &'static str,
    /// One line for `mlx-spec providers`.
    pub description: &'static str,
    /// The crate that registered it (`env!("CARGO_PKG_NAME")`), for errors.
    pub crate_name: &'static str,
    /// Its constructor.
    pub build: BuildFn,
    /// The options a request may set, with their ranges
    /// ([`crate::request_options`]); every other option is the operator's.
    /// Empty: a request sets none.
    pub request_options: &'static [RequestOption],
}

inventory::collect!(ProviderRegistration);

/// Registers a draft provider: its id, a one-line description, its
/// constructor, `fn(&dyn Target, &ProviderOptions) -> Result<P, SpecError>`
/// for any `P: DraftProvider + 'static` (the macro boxes it), and
/// optionally the options a request may set (`request_options`, a
/// `&'static [RequestOption]`; left out, a request sets none). The crate
/// name recorded for error messages is the calling crate's.
///
/// ```ignore
/// spec_core::register_provider! {
///     id: "my-provider",
///     description: "one line for `mlx-spec providers`",
///     build: MyProvider::new,
///     request_options: &[spec_core::RequestOption {
///         key: "num_draft",
///         range: spec_core::OptionRange::Whole { min: 1, max: 16 },
///     }],
/// }
/// ```
///
/// The crate documentation holds a complete provider using it.
#[macro_export]
macro_rules! register_provider {
    (id: $id:expr, description: $description:expr, build: $build:expr $(,)?) => {
        $crate::register_provider! {
            id: $id,
            description: $description,
            build: $build,
            request_options: &[],
        }
    };
    (
        id: $id:expr,
        description: $description:expr,
        build: $build:expr,
        request_options: $request_options:expr $(,)?
    ) => {
        $crate::inventory::submit! {
            $crate::ProviderRegistration {
                id: $id,
                description: $description,
                crate_name: ::core::env!("CARGO_PKG_NAME"),
                build: {
                    fn __build_provider(
                        target: &dyn $crate::Target,
                        options: &$crate::ProviderOptions,
                    ) -> ::core::result::Result<
                        ::std::boxed::Box<dyn $crate::DraftProvider>,
                        $crate::SpecError,
                    > {
                        let provider = ($build)(target, options)?;
                        ::core::result::Result::Ok(::std::boxed::Box::new(provider))
                    }
                    __build_provider
                },
                request_options: $request_options,
            }
        }
    };
}

/// Every registration linked into this program, sorted by id.
pub fn registrations() -> Vec<&'static ProviderRegistration> {
    let mut all: Vec<&'static ProviderRegistration> = inventory::iter::<ProviderRegistration>
        .into_iter()
        .collect();
    all.sort_by(|a, b| a.id.cmp(b.id).then(a.crate_name.cmp(b.crate_name)));
    all
}

/// The registration of `id`: an error listing the known ids when there is
/// none, and naming both crates when two registered the same id.
pub fn resolve(id: &str) -> Result<&'static ProviderRegistration, SpecError> {
    let all = registrations();
    let matching: Vec<_> = all.iter().filter(|r| r.id == id).collect();
    match matching.as_slice() {
        [one] => Ok(one),
        [] => Err(SpecError::UnknownProvider {
            id: id.to_owned(),
            available: all.iter().map(|r| r.id).collect::<Vec<_>>().join(", "),
        }),
        [first, second, ..] => Err(SpecError::DuplicateProvider {
            id: id.to_owned(),
            first: first.crate_name.to_owned(),
            second: second.crate_name.to_owned(),
        }),
    }
}
