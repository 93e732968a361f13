"""The comparison report: a markdown table and a chart, written under reports/ (README.md links
to them; nothing else is rewritten).

Input is plain data: result rows (one per strategy and run) and ceilings, as compare builds
them, so the writer can be tested and rerun on saved results (reports/compare.json).
"""

import os
import platform
import socket
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .stats import ANSWERS, CAUSES, histogram_buckets

RUNS = (
    "bench hot",
    "bench throughput",
    "bench lone",
    "HTTP hot",
    "HTTP throughput",
    "HTTP hot (wrk)",
    "HTTP throughput (wrk)",
)

COLUMNS: list[tuple[str, str, str]] = [
    # (key, header, format)
    ("strategy", "strategy", "s"),
    ("run", "run", "s"),
    ("concurrency", "in flight", ",.0f"),  # the bench's grabs in flight (compare.bench_concurrency)
    ("requests_per_s", "requests/s", ",.0f"),
    ("grabs_per_s", "grabs/s", ",.0f"),
    ("success_rate", "success", "%"),
    ("contended_share", "contended", "%"),
    ("oversold", "oversold", "d"),
    ("duplicates", "dup.", "d"),
    ("p50_ms", "p50 ms", ",.1f"),
    ("p95_ms", "p95 ms", ",.1f"),
    ("p99_ms", "p99 ms", ",.1f"),
    ("mysql_queries_per_request", "MySQL q/req", "mysql"),
    ("redis_commands_per_request", "Redis cmd/req", ".2f"),
    ("cpu_seconds_per_1k_requests", "CPU s/1k req", ".2f"),
    ("settle_seconds", "persist lag s", ".2f"),
    ("ceiling_ratio", "of ceiling", "%"),
    ("ceiling", "ceiling", "kind"),
    ("audit_ok", "audit", "audit"),
]
# Cost per request of the direct bench rows (bench.py): where each strategy spends its time.
COST_COLUMNS: list[tuple[str, str, str]] = [
    ("strategy", "strategy", "s"),
    ("run", "run", "s"),
    ("requests_per_s", "requests/s", ",.0f"),
    ("mean_batch", "mean batch", ".1f"),
    ("own_sql_ratio", "of own SQL raw", "%"),
    ("client_cpu_us_per_request", "client CPU µs", ",.0f"),
    ("redis_cpu_us_per_request", "Redis CPU µs", ",.1f"),
    ("redis_evalsha_us_per_request", "in EVALSHA µs", ",.1f"),
    ("mysql_cpu_us_per_request", "MySQL CPU µs", ",.0f"),
    ("row_lock_wait_ms", "row-lock wait ms", ",.0f"),
    ("row_lock_hold_us_per_request", "row-lock hold µs", ",.1f"),
    ("projected_per_redis_shard", "per Redis shard /s", ",.0f"),
    ("projected_per_mysql_row", "per MySQL row /s", ",.0f"),
    ("projected_per_row_lock", "per row lock /s", ",.0f"),
]
# The HTTP runs as a user lives them: every request's cause, latency, and the generator's CPU.
HTTP_COLUMNS: list[tuple[str, str, str]] = [
    ("strategy", "strategy", "s"),
    ("run", "run", "s"),
    ("requests", "requests", ",.0f"),
    ("unanswered", "unanswered", "d"),
    ("causes", "answers by cause", "causes"),
    ("p50_ms", "p50 ms", ",.0f"),
    ("p95_ms", "p95 ms", ",.0f"),
    ("p99_ms", "p99 ms", ",.0f"),
    ("p99_budget", "hot p99 budget ms", "budget"),
    ("max_ms", "max ms", ",.0f"),
    ("within_1s", "within 1 s", "%"),
    ("of_ping_beside", "÷ pings beside it (÷ before–after)", "beside"),
    ("generator_cpu_share", "generator CPU", "generator"),
    ("steal_share", "steal (ping beside)", "steal"),
    ("rounds", "rounds (the median kept)", "rounds"),
    ("pings_failed", "pings beside it without a 200", "pings_failed"),
]
# A run whose steal differs from the ping's beside it by this much (a share of the machine) or
# more is marked: its ratio to that ping is the neighbours' as much as the software's.
STEAL_APART = 0.05
LAG_SHOWN_FROM = 0.05  # seconds: below this every strategy is synchronous, so no column


def cell(value: Any, fmt: str) -> str:
    if value is None:
        return "–"
    if fmt == "mysql":
        server_wide, own = value
        shown = cell(server_wide, ".2f")
        # The bench also counts its own connections' statements, immune to other clients.
        if own is not None and (server_wide is None or abs(server_wide - own) > 0.1 * own + 0.05):
            shown += f" (own {own:.2f})"
        return shown
    if fmt == "audit":
        return "ok" if value else "**FAILED**"
    if fmt == "%":
        return f"{100 * value:.1f}%"
    if fmt == "d":
        return str(int(value)) if not value else f"**{int(value)}**"
    if fmt == "s":
        return str(value)
    if fmt == "causes":
        return ", ".join(f"{cause} {count:,}" for cause, count in value.items()) or "–"
    if fmt == "budget":
        return budget_cell(value)
    if fmt == "generator":
        share, bound = value
        if share is None:
            return "–"
        return f"{100 * share:.0f}%" + (" **generator-bound**" if bound else "")
    if fmt == "steal":
        return steal_cell(*value)
    if fmt == "beside":
        return beside_cell(value)
    if fmt == "rounds":
        return rounds_cell(value)
    if fmt == "pings_failed":
        return "; ".join(f"**{line}**" for line in value)
    if fmt == "kind":
        return str(value).split(":")[0]  # "MySQL: hot-row UPDATE …" -> "MySQL"
    return format(value, fmt)


def _columns(results: Sequence[dict[str, Any]]) -> list[tuple[str, str, str]]:
    lagging = any((r.get("settle_seconds") or 0) >= LAG_SHOWN_FROM for r in results)
    return [c for c in COLUMNS if c[0] != "settle_seconds" or lagging]


def results_table(results: Sequence[dict[str, Any]], columns: list | None = None) -> str:
    columns = columns or _columns(results)
    lines = [
        "| " + " | ".join(header for _, header, _ in columns) + " |",
        "|" + "|".join("---" if fmt in {"s", "kind"} else "---:" for _, _, fmt in columns) + "|",
    ]
    for row in results:
        cells = [cell(_value(row, key, fmt), fmt) for key, _, fmt in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _value(row: dict[str, Any], key: str, fmt: str) -> Any:
    if fmt == "mysql":
        return (row.get(key), row.get("mysql_queries_per_request_own"))
    if fmt == "generator":
        return (row.get(key), row.get("generator_bound"))
    if fmt == "budget":
        return row
    if fmt == "steal":
        return (row.get(key), row.get("steal_share_beside"))
    if fmt == "beside":
        return beside_of(row)
    return row.get(key)


def beside_of(row: dict[str, Any]) -> tuple[float | None, float | None, float | None]:
    """A many-packets run's shares of the pings beside it, as `beside_cell` shows them."""
    return (row.get("of_ping_beside"), row.get("of_ping_before"), row.get("of_ping_after"))


def beside_cell(value: tuple[float | None, float | None, float | None]) -> str:
    """A many-packets run's share of the mean of the pings on either side of it, with its
    shares of each (before–after) when both were measured: how far the machine's pace moved
    over the run."""
    mean, before, after = value
    if mean is None:
        return "–"
    shown = f"{100 * mean:.1f}%"
    if before is None or after is None:
        return shown
    return f"{shown} ({100 * before:.1f}–{100 * after:.1f}%)"


# Causes a round of a repeated run is flagged for (rounds_cell): no answer, or none of the
# contract's (a shed `contended` is one, and a timed run's cut-off requests are nobody's wait).
FLAGGED_CAUSES = tuple(c for c in CAUSES if c not in ANSWERS and c not in {"shed", "cut_off"})


def rounds_cell(rounds: Sequence[dict[str, Any]]) -> str:
    """A wrk run's rounds (compare.median_round), in the order they ran: a many-packets run's
    share of the pings beside it, a hot burst's p99 against its budget (its ping bursts'),
    in seconds; a failed audit, and requests of a FLAGGED_CAUSES cause, in bold."""
    parts = []
    for row in rounds:
        figure, p99 = row.get("figure"), row.get("p99_ms")
        if row.get("p99_budget_ms") is not None and p99 is not None:
            text = f"{p99 / 1000:.2f} of {row['p99_budget_ms'] / 1000:.2f} s"
        elif figure is not None:
            text = f"{figure:.2f}"
        else:
            text = "–"
        if not row.get("audit_ok"):
            text += " **audit FAILED**"
        causes = row.get("causes") or {}
        text += "".join(f" **{causes[c]:,} {c}**" for c in FLAGGED_CAUSES if causes.get(c))
        parts.append(text)
    return "; ".join(parts)


def http_columns(results: Sequence[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """HTTP_COLUMNS, with `rounds` only when some run was repeated and `pings_failed` only
    when some ping beside a run had a request without a 200."""
    shown = {key for key in ("rounds", "pings_failed") if any(r.get(key) for r in results)}
    return [c for c in HTTP_COLUMNS if c[0] not in ("rounds", "pings_failed") or c[0] in shown]


def steal_cell(run: float | None, beside: float | None) -> str:
    """A run's steal share, with the ping's beside it; bold when they are STEAL_APART apart."""
    if run is None:
        return "–"
    shown = f"{100 * run:.0f}%"
    if beside is None:
        return shown
    if abs(run - beside) >= STEAL_APART:
        shown = f"**{shown}**"
    return f"{shown} (ping {100 * beside:.0f}%)"


BUDGET_SHAPES = (("burst", "ping burst"), ("kept_alive", "kept-alive ping"))


def budget_cell(row: dict[str, Any]) -> str:
    """A hot burst's p99 budgets: against the ping in its own shape when measured, and against
    the kept-alive ping, each `met` or **over** ("–" for other runs)."""
    parts = []
    for shape, label in BUDGET_SHAPES:
        budget = row.get(f"p99_budget_{shape}_ms")
        if budget is not None:
            verdict = "met" if row.get(f"p99_within_{shape}") else "**over**"
            parts.append(f"{budget:,.0f} {verdict} ({label})")
    return "; ".join(parts) or "–"


def shown_cell(value: Any, fmt: str) -> tuple[str, bool]:
    """A cell as a web page shows it: the markdown cell's text, and whether it is flagged (the
    markdown's bold: an oversold count, a failed audit, a generator-bound run)."""
    text = cell(value, fmt)
    return text.replace("**", ""), "**" in text


def shown_rows(
    results: Sequence[dict[str, Any]], columns: list | None = None
) -> tuple[list[str], list[list[tuple[str, bool]]]]:
    """Headers and cells of results_table, for a web page (shares as percentages)."""
    columns = columns or _columns(results)
    rows = [[shown_cell(_value(r, key, fmt), fmt) for key, _, fmt in columns] for r in results]
    return [header for _, header, _ in columns], rows


MACHINE_ID_FILES = (Path("/etc/machine-id"), Path("/var/lib/dbus/machine-id"))


def this_machine() -> dict[str, Any]:
    """Which machine measured: compare writes it into the report's context, and the admin
    shows a report as this machine's only when the ids match (a committed report comes from
    another machine). The id is the OS's machine id, else the host name."""
    host = socket.gethostname()
    machine_id = next(
        (f.read_text().strip() for f in MACHINE_ID_FILES if f.is_file() and f.stat().st_size),
        host,
    )
    return {
        "id": machine_id,
        "host": host,
        "cpus": os.cpu_count() or 1,
        "platform": platform.platform(terse=True),
    }


def measured_here(context: dict[str, Any]) -> bool:
    return (context.get("machine") or {}).get("id") == this_machine()["id"]


@dataclass(frozen=True)
class Workload:
    name: str
    runs: tuple[str, ...]  # the first of these the report has is the one compared
    figure: str  # a result row's key
    unit: str
    higher_is_better: bool = True
    without_redis: bool = False  # only strategies that need no Redis


WORKLOADS = (
    Workload("Few packets, many users", ("bench hot", "HTTP hot"), "requests_per_s", "req/s"),
    Workload("Many packets", ("bench throughput", "HTTP throughput"), "grabs_per_s", "grabs/s"),
    Workload(
        "MySQL only (no Redis)",
        ("bench throughput", "HTTP throughput"),
        "grabs_per_s",
        "grabs/s",
        without_redis=True,
    ),
    Workload("One grab at a time", ("bench lone",), "p50_ms", "ms p50", higher_is_better=False),
)


def recommendations(
    results: Sequence[dict[str, Any]], *, without_redis: Collection[str]
) -> list[dict[str, Any]]:
    """For each workload, the safe strategy with a clean audit that did best in the report's
    run for it, and by how much it beat the next one: computed from the figures."""
    found = []
    for workload in WORKLOADS:
        run = next((r for r in workload.runs if any(x.get("run") == r for x in results)), None)
        rows = [
            r
            for r in results
            if r.get("run") == run
            and r.get("safe", True)
            and r.get("audit_ok")
            and r.get(workload.figure) is not None
            and (not workload.without_redis or r["strategy"] in without_redis)
        ]
        rows.sort(key=lambda r: r[workload.figure], reverse=workload.higher_is_better)
        entry: dict[str, Any] = {"workload": workload.name, "run": run, "strategy": None}
        if rows:
            best = rows[0]
            entry.update(strategy=best["strategy"], figure=_figure(best, workload))
            if len(rows) > 1:
                second = rows[1]
                low, high = sorted((best[workload.figure], second[workload.figure]))
                entry.update(
                    runner_up=second["strategy"],
                    runner_up_figure=_figure(second, workload),
                    ratio=f"{high / low:.1f}×" if low else "–",
                )
        found.append(entry)
    return found


def _figure(row: dict[str, Any], workload: Workload) -> str:
    value = row[workload.figure]
    return f"{value:,.2f} {workload.unit}" if value < 10 else f"{value:,.0f} {workload.unit}"


def histogram_table(rows: Sequence[dict[str, Any]]) -> str:
    """Requests per latency bucket, one line per HTTP run (buckets of stats.HISTOGRAM_MS)."""
    ordered = histogram_buckets(r.get("latency_histogram") or {} for r in rows)
    lines = [
        "| strategy | run | " + " | ".join(ordered) + " |",
        "|---|---|" + "---:|" * len(ordered),
    ]
    for row in rows:
        counts = row.get("latency_histogram") or {}
        cells = [f"{counts[b]:,}" if counts.get(b) else "" for b in ordered]
        lines.append(f"| {row['strategy']} | {row['run']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ceilings_table(ceilings: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| ceiling | tool | requests/s | p50 ms | p99 ms | note |",
        "|---|---|---:|---:|---:|---|",
    ]
    for c in ceilings:
        rate = cell(c.get("requests_per_s"), ",.0f")
        p50, p99 = cell(c.get("p50_ms"), ".2f"), cell(c.get("p99_ms"), ".2f")
        note = c.get("note", "")
        if c.get("failed"):  # a ping that lost or refused requests fails the comparison
            note = "; ".join(filter(None, [f"**{c['failed']:,} without a 200**", note]))
        lines.append(f"| {c['name']} | {c['tool']} | {rate} | {p50} | {p99} | {note} |")
    return "\n".join(lines)


LEGEND = """\
How to read it:

- **run**: `bench` drives `services.activity_grab` directly from processes × threads (no HTTP);
  `HTTP` is Locust against gunicorn, `HTTP … (wrk)` the same from wrk, a C generator with a
  Lua script (redpack/lab/wrk_grab.lua) that costs the machine far less per request. `hot` is
  many users on a small activity (seed 000's 10,000 users and 100 packets; wrk opens one
  connection per user, all at once); `throughput` is a large activity grabbed back to back
  (seed 002).
- **requests/s**: grab requests answered per second, first click to last answer.
  **grabs/s**: of those, `grabbed` answers per second.
- **success**: share of requests that got a final answer (grabbed, already_grabbed,
  sold_out, closed); `contended` answers and errors are the rest. **contended**: share of
  requests answered `contended` (nothing this time although packets may remain).
- **oversold** / **dup.**: from the auditor; anything but 0 is a broken invariant.
- **p50/p95/p99**: latency of one grab as the client saw it.
- **MySQL q/req**, **Redis cmd/req**: server-wide `Questions` and `total_commands_processed`
  deltas per request, the meters' own reads subtracted. On a shared machine they include
  other clients' work; bench rows add in parentheses the statements counted on the bench's
  own connections when the two differ. HTTP rows include the per-user throttle's Redis
  commands.
- **CPU s/1k req**: CPU seconds per 1,000 requests of the servers: MySQL and Redis, plus the
  bench's own processes (bench rows) or gunicorn and Celery (HTTP rows); Locust's own CPU is
  not counted.
- **persist lag**: seconds from the last answer until every acknowledged grab was in MySQL
  (shown when an asynchronous strategy has any).
- **of ceiling**: requests/s divided by the ceiling that bounds the run: `group_commit`, the
  hot-row UPDATE rate; `redis_queue` and `redis_counter` (batched, MySQL written inside the
  request), the raw grab transaction with 32 grabs each; other strategies that stay off
  MySQL per grab (fewer than one MySQL statement per request), their own Redis script's
  EVALSHA rate; the seeds with statements of their own (`distributed_lock`, `preallocated`,
  `preallocated_skip_locked`, `redis_queue_single`), those statements run raw from plain
  mysqlclient threads (GrabStrategy.raw_grab); the rest, the raw one-grab transaction
  (pessimistic's SQL without this project's Python). HTTP rows also cannot beat the web
  server's ping rate (measured by the same generator), so their ceiling is the lower of the
  two.
- **hot p99 budget**: a hot burst's p99 held to its requests ÷ a ping rate + 1 s (the time
  to answer everybody at the ping's pace, plus a second), `met` or **over**, against two
  pings of the run's own generator: the **ping burst** (wrk only: every hot user at once on a
  connection of its own, one request each, as the burst itself; measured again just before
  and just after each hot burst, as the pings beside a many-packets run are, and their mean
  rate taken (`ping_burst_beside_per_s` in the JSON, each one's beside it); the one at the
  start when neither was answered in full with wrk below its bottleneck) and the **kept-alive ping**
  (the ceiling above). A burst's p99 is close to its own length, so the first verdict says
  whether a grab in the burst costs more than a no-op in the same shape; the second, whether
  the burst is answered at the pace of kept-alive requests, which also pays for accepting
  ten thousand connections. wrk's latency starts at the request's write (the connect is not
  in it).
- **Cost per request** (bench rows): the bench processes' CPU (client), Redis's CPU and the
  time inside its EVALSHA calls (INFO commandstats), the MySQL server's CPU, each divided by
  the requests; InnoDB's row-lock wait over the run (Innodb_row_lock_time, time spent waiting);
  the row-lock hold per request (strategies/holds.py: from the return of the statement that
  locked the activity row to the return of the COMMIT, summed over the grab transactions, by
  the client's clock: an upper bound, since a thread under load wakes late after each
  statement, which the server does not wait for); the combiner's mean batch; **of own SQL
  raw**, the bench's rate ÷ the strategy's own statements run raw from plain mysqlclient
  threads in the same run (the seeds' one grab per transaction, `redis_queue`'s and
  `redis_counter`'s batch transaction with 32 grabs each: GrabStrategy.raw_batch), what this
  project's Python leaves of what MySQL does with the same SQL;
  and the grabs/s one Redis shard or one activity row could take if the client side were
  free (10⁶ / its µs per request), the row's both by MySQL's CPU and by its lock hold (a
  lower bound, from the upper bound of the hold).
- **Over HTTP**: every grab request by cause: the contract's answers (`shed`: a `contended` given
  at once because the activity's line in that web process was full), `throttled` (429),
  `outcome_unknown` (503), other `5xx`, `client_timeout` and `connection_error` (no answer reached
  the client: **unanswered**; in a burst, also a request still waited for at its cap), and
  `cut_off`: in flight when a timed run's clock stopped it, at most one per connection (its grab,
  if any, is checked in MySQL; it comes on top of **requests**), not a request anybody waited for;
  in a timed run, requests without an answer beyond one per connection were lost with a broken
  connection, `connection_error`. A request Locust counted without a cause fails the run. **within
  1 s**: share of the requests answered within a second. **÷ pings beside it** (wrk's many-packets
  runs): grabs/s ÷ the mean of wrk's kept-alive pings measured just before the run and just after
  it (once its grabs were written), on the same connections for as long, from the same script
  over the same users; in brackets, its share of the one before and of the one after: how far a
  shared machine's pace moved over the run (the ping at the start of a long comparison may have
  been measured at yet another pace). **generator CPU**: the generator's
  own CPU over the run per Locust process (one core each) or per wrk thread; at 90% and above the
  load generator, not the server, may be the limit. **steal (ping beside)**: the share of the
  machine's CPU time the hypervisor gave other guests over the run (0 off a virtual machine), and
  over the ping beside it (for wrk's runs, the mean of the pings before and after); in bold
  when the two are 5 points or more apart, since the run's pace against that ping is then the
  neighbours' as much as the software's. wrk times a request from its write: in the hot burst
  the TCP connect before it is not in the latency (the run's seconds, from wrk's start to the
  last answer, include it); it cannot tell which user an answer went to, so its `grabbed`
  answers are checked against MySQL by number and amounts, beside the auditor's invariants.
- **rounds** (`--rounds N`, shown when N > 1): each strategy's wrk many-packets run and hot
  burst ran N times, each round with its own pings beside it and a new activity. The row keeps
  the median round's figures (of an even number, the worse of the two in the middle), ranked
  by the many-packets run's share of its pings or by how far the hot burst's p99 stayed within
  its ping bursts' budget; the column lists every round in the order they ran (the share, or
  the p99 of its budget in seconds), with a failed audit and any request without an answer of
  the contract (unanswered, `5xx`, `outcome_unknown`, `throttled`, another status) in bold.
  What must hold in every round is taken from all of them: the audit passes only if it passed
  in each, and **oversold** and duplicates are the largest of any round; the other columns are
  the kept round's.
- **pings beside it without a 200** (shown only when there are some): a ping or ping burst
  measured beside a run whose requests did not all get a 200, each with its count (every round's,
  when repeated): the server lost or refused a no-op, so the comparison fails (its exit status
  is 1), whatever the strategies' audits say.
"""


def write_markdown(
    path: Path,
    *,
    results: Sequence[dict[str, Any]],
    ceilings: Sequence[dict[str, Any]],
    context: dict[str, Any],
    chart: str | None = "compare.png",
) -> None:
    parts = [
        "# Strategy comparison",
        "",
        f"Generated by `{context.get('command', 'manage.py compare')}` on "
        f"{context.get('finished_at', '?')} (commit {context.get('commit', '?')}), "
        f"{context.get('cpus', '?')} CPUs, load average {context.get('load_before', '?')} "
        f"before the run. Concurrency {context.get('concurrency', '?')}"
        f" ({context.get('batched_concurrency', '?')} for the bench runs of the strategies that"
        " combine grabs).",
        "",
    ]
    if context.get("warning"):
        parts += [f"> **{context['warning']}**", ""]
    if context.get("rendered_again"):  # the same figures, the report's derived columns redone
        parts += [f"Rendered again: {context['rendered_again']}.", ""]
    parts += ["## Results", "", results_table(results), ""]
    if chart:
        parts += [f"![throughput and p99 per strategy]({chart})", ""]
    bench_rows = [r for r in results if str(r.get("run", "")).startswith("bench")]
    if bench_rows:
        parts += ["## Cost per request", "", results_table(bench_rows, COST_COLUMNS), ""]
    http_rows = [r for r in results if str(r.get("run", "")).startswith("HTTP")]
    if http_rows:
        parts += ["## Over HTTP: every request's answer and wait", ""]
        parts += [results_table(http_rows, http_columns(http_rows)), ""]
        if any(r.get("latency_histogram") for r in http_rows):
            parts += ["Requests per latency bucket:", "", histogram_table(http_rows), ""]
    parts += ["## Ceilings on this machine", "", ceilings_table(ceilings), ""]
    books = context.get("books")
    if books:
        verdict = "balance" if books["ok"] else f"DO NOT balance: {'; '.join(books['violations'])}"
        parts += [
            "## Money",
            "",
            f"After the last run, {books['credited']:,} grabs were credited to their grabbers' "
            f"wallets in {books['seconds']} s ({books['credits_per_s'] or 0:,.0f} a second; the "
            "crediting task waits during the runs, which it would only blur on a shared "
            f"machine), and the books {verdict}."
            + (
                f" Each credit cost {books['python_us_per_credit']} µs of the crediting "
                f"Python's CPU and {books['mysql_us_per_credit']} µs of MySQL's."
                if books.get("python_us_per_credit") is not None
                and books.get("mysql_us_per_credit") is not None
                else ""
            )
            + (
                f" The unsafe baseline's {books['not_credited_unsafe']:,} oversold grabs were "
                "not credited: no money was in the escrow for them."
                if books.get("not_credited_unsafe")
                else ""
            ),
            "",
        ]
    parts += [LEGEND]
    if context.get("settings"):
        parts += ["", "## Settings", "", "```", *context["settings"], "```", ""]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(parts))


def write_chart(
    path: Path, *, results: Sequence[dict[str, Any]], ceilings: Sequence[dict[str, Any]]
) -> None:
    """Grouped bars per strategy: throughput (with the ceilings as lines) and p99."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    strategies = list(dict.fromkeys(r["strategy"] for r in results))
    runs = [run for run in RUNS if any(r["run"] == run for r in results)]
    figure, (rate_axis, p99_axis) = plt.subplots(1, 2, figsize=(13, 5.5))
    width = 0.8 / max(len(runs), 1)
    for index, run in enumerate(runs):
        by_strategy = {r["strategy"]: r for r in results if r["run"] == run}
        xs = [s + (index - (len(runs) - 1) / 2) * width for s in range(len(strategies))]
        rates = [(by_strategy.get(s) or {}).get("requests_per_s") or 0 for s in strategies]
        p99s = [(by_strategy.get(s) or {}).get("p99_ms") or 0 for s in strategies]
        rate_axis.bar(xs, rates, width, label=run)
        p99_axis.bar(xs, p99s, width, label=run)
    styles = {"redis": "--", "mysql": ":", "web": "-.", "web_wrk": "-.", "web_burst": "-."}
    for ceiling in ceilings:
        if ceiling.get("requests_per_s") and not ceiling.get("strategy"):
            rate_axis.axhline(
                ceiling["requests_per_s"],
                color="grey",
                linestyle=styles.get(ceiling["kind"], "-"),
                linewidth=1,
                label=ceiling["name"].split(" (")[0],
            )
    for axis, title, unit in (
        (rate_axis, "Throughput (higher is better)", "requests/s"),
        (p99_axis, "p99 latency (lower is better)", "ms"),
    ):
        axis.set_title(title)
        axis.set_ylabel(unit)
        axis.set_xticks(range(len(strategies)), strategies, rotation=30, ha="right")
        if any(r.get("requests_per_s") for r in results):
            axis.set_yscale("log")
        axis.grid(axis="y", alpha=0.3)
    handles, labels = rate_axis.get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=4, fontsize=8, frameon=False)
    figure.tight_layout(rect=(0, 0.1, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
