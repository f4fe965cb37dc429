"""End to end against a real llama.cpp llama-server (b10434, CPU, tiny random GGUF, ngram-simple drafts of up to 4).

The /metrics page after a few finished greedy requests carries the speculative-decoding counters the llama.cpp
adapter reads, and they agree with what the requests themselves reported (each answer's `timings.draft_n` and
`draft_n_accepted`). Runs whenever scripts/setup-llamacpp.sh has installed the server (see e2e_llamacpp.py).
"""

from __future__ import annotations

import httpx
import pytest
from e2e_llamacpp import LlamaCppServer, parse_page, run_load

pytestmark = [pytest.mark.e2e]

DRAFT_TOKENS = "llamacpp:spec_decode_num_draft_tokens_total"
ACCEPTED = "llamacpp:spec_decode_num_accepted_tokens_total"
DRAFTS = "llamacpp:spec_decode_num_drafts_total"
PER_POS = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"


def _scrape(server: LlamaCppServer) -> dict[str, float]:
    response = httpx.get(f"{server.base_url}/metrics", timeout=10.0)
    assert response.status_code == 200, response.text[:500]
    assert response.headers["content-type"].startswith("text/plain")
    return parse_page(response.text)


def test_metrics_page_counts_the_drafts_of_finished_requests(llamacpp_server: LlamaCppServer) -> None:
    before = _scrape(llamacpp_server)
    load = run_load(llamacpp_server.base_url)
    llamacpp_server.assert_alive()
    after = _scrape(llamacpp_server)

    def delta(key: str) -> float:
        return after[key] - before.get(key, 0.0)

    assert load.draft_tokens > 0, f"the load drafted nothing: {load}"
    assert after[DRAFTS] > 0
    assert f'{PER_POS}{{position="0"}}' in after
    assert after[ACCEPTED] <= after[DRAFT_TOKENS]
    # The page counts exactly what the finished requests reported, and a draft holds 1..draft_max tokens.
    assert delta(DRAFT_TOKENS) == load.draft_tokens
    assert delta(ACCEPTED) == load.accepted_tokens
    assert delta(DRAFTS) <= delta(DRAFT_TOKENS) <= llamacpp_server.draft_max * delta(DRAFTS)
    assert delta("llamacpp:tokens_predicted_total") == load.tokens_predicted
    # One series per draft position (ngram-simple: --spec-ngram-simple-size-m of them); an accepted token counts at
    # its position, so the series fall with the position, sum to the accepted total, and none exceeds the drafts.
    per_pos = [after[f'{PER_POS}{{position="{i}"}}'] for i in range(llamacpp_server.draft_max)]
    assert sorted(key for key in after if key.startswith(PER_POS)) == sorted(
        f'{PER_POS}{{position="{i}"}}' for i in range(llamacpp_server.draft_max)
    )
    assert per_pos == sorted(per_pos, reverse=True)
    assert sum(per_pos) == after[ACCEPTED]
    assert per_pos[0] <= after[DRAFTS]
