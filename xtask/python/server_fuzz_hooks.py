"""Schemathesis hooks of gate `server` (loaded through `SCHEMATHESIS_HOOKS` by
`server_check.py`): bound how many tokens a fuzzed request may generate.

The OpenAPI document caps `max_tokens` (and `max_output_tokens`) at 8, but the server accepts up to
1,000,000 (bounded by the context), and negative cases ask for more than the
schema's maximum on purpose (its boundary, 9, and large integers): each such
request decoded hundreds of tokens of SmolLM2 on the gate's two cores, most of
the fuzz run's time. An integer `max_tokens` (or `max_completion_tokens`) the
server would accept but the schema does not becomes 9: still past the schema's
maximum, still accepted, the same code path, a few tokens long. Values the
server rejects (0, negatives, past 1,000,000, another type) are sent as
generated, so its validation is fuzzed as before. Requests without
`max_tokens` get the server's default, which the gate sets to 8
(`--default-max-tokens`).
"""
import schemathesis

SCHEMA_MAX = 8
SERVER_MAX = 1_000_000


@schemathesis.hook
def before_call(context, case, kwargs):
    body = case.body
    if not isinstance(body, dict):
        return
    for key in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and SCHEMA_MAX < value <= SERVER_MAX:
            body[key] = SCHEMA_MAX + 1
