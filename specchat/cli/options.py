"""The options `run`, `chat`, `bench` and `serve` share: their Typer types, and one object holding them.

Why one object: the commands take the same generation and loading settings. Typer reads each
command's own signature, so every command lists its options with the Annotated aliases below; it then
builds one `Options`, validated once here, and hands that on. How a setting is checked, what it
defaults to and how it becomes a `loader.LoadConfig` or planner choice is written once, in this
module, and no command module imports another.

The sampling settings (`--temp`, `--top-k`, `--top-p`, ...) are not listed here at all: they are
`decoding/settings.py`'s table, and `sampling_options` turns each entry into a Typer option. Typer
needs a real parameter per option to show it in `--help` and parse it, so the decorator rewrites the
command's signature: it replaces the one parameter `sampling: SamplingParams` by one keyword
parameter per setting, typed, defaulted and helped from the table (Typer renders those exactly like
a hand-written `Annotated[float, typer.Option("--top-p", help=...)] = default`), and at call time folds
them back into one `SamplingParams`, whose own check reports a bad value as one line naming the flag.
The alternatives were worse: Annotated aliases with defaults from the table still need a parameter and
an argument per setting in every command (~13 edits), and a shared Typer callback
cannot carry options for `run`, `chat` and `serve` alike.

Nothing heavy is imported at module level (`decoding.settings` and `decoding.registry` are standard
library only), so `specchat --help` stays instant.
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from ..decoding.registry import FORM, described, is_model_free, make
from ..decoding.settings import (
    AUTO_TREE_WIDTH,
    CTX_SIZE,
    DRAFT_WINDOW,
    MAX_TOKENS,
    SETTINGS,
    TREE_BRANCHES,
    SamplingParams,
    SettingError,
)
from ..errors import BadInput
from .common import check_range

if TYPE_CHECKING:
    from ..models.loader import LoadConfig

F = TypeVar("F", bound=Callable[..., Any])


# --- option types, reused by every command that takes the setting -----------------------------------------
TargetArg = Annotated[
    str,
    typer.Argument(
        help="Target model: an alias from `specchat models`, a .gguf path, hf:ORG/REPO/FILE.gguf "
        "or ORG/REPO:QUANT."
    ),
]
DraftOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--draft",
        "-d",
        help=f"Draft model (same forms as TARGET), or a model-free drafter: {described()}; "
        f"configure one as {FORM} (e.g. `ngram:max_n=12,min_n=3`). Repeat to give several. "
        "Default: the target's recommended draft model and `ngram` (routed per round by the cost "
        "model), or `ngram` alone for a target outside the registry.",
    ),
]
NoDraftOpt = Annotated[
    bool, typer.Option("--no-draft", help="Plain decoding with the target alone (the baseline).")
]
KOpt = Annotated[
    str,
    typer.Option(
        "--draft-tokens", "-k", help="Tokens drafted per round: a number (0 = none) or `auto` (cost model)."
    ),
]
PMinOpt = Annotated[
    float | None,
    typer.Option(
        "--draft-p-min",
        help="Stop drafting when the draft's confidence falls below this (default with -k auto: "
        "none, the cost model decides how far to draft; with -k N: 0.75 greedy, 0.5 sampling).",
    ),
]
TreeWidthOpt = Annotated[
    int | None,
    typer.Option(
        "--tree-width",
        help="Token trees: a draft model's second candidates at its least sure positions, and "
        "prompt lookup's continuations from other places the context repeats, verified in the same "
        "target batch as the draft (at most this many side branches per round; 0 = chains only). "
        "Default: 4 with -k auto, where the cost model adds a node only where its verify row pays; "
        "0 with -k N.",
    ),
]
DraftWindowOpt = Annotated[
    int | None,
    typer.Option(
        "--draft-window",
        metavar="TOKENS",
        help="Recent tokens a draft model attends to, besides the context's first four: past it the "
        "draft's cache keeps only those, so its steps stay as cheap at long contexts as at short ones "
        "(the target still checks every token against the whole context). 0 = the whole context. "
        f"Default: {DRAFT_WINDOW}.",
    ),
]
SeedOpt = Annotated[int | None, typer.Option("--seed", help="Random seed for sampling (repeatable runs).")]
MaxTokOpt = Annotated[int, typer.Option("--max-tokens", "-n", help="Stop after this many generated tokens.")]
CtxOpt = Annotated[int, typer.Option("--ctx-size", "-c", help="Context window in tokens (prompt + output).")]
GpuOpt = Annotated[
    int | None,
    typer.Option(
        "--gpu-layers",
        help="Target layers to offload to the GPU (default: all if the build can offload, else 0).",
    ),
]
DraftGpuOpt = Annotated[
    int | None, typer.Option("--draft-gpu-layers", help="Draft layers to offload (default: as --gpu-layers).")
]
RpcOpt = Annotated[
    str | None,
    typer.Option(
        "--rpc",
        metavar="HOST:PORT[,...]",
        help="Split the target's layers over this machine and these llama.cpp RPC workers "
        "(`specchat worker` on each), by free memory; the draft models and heads stay here. "
        "With --gpu-layers N, N layers (from the last, the output counted as one) are offloaded: the "
        "workers take the others, the output layer stays here.",
    ),
]
ThreadsOpt = Annotated[
    int | None, typer.Option("--threads", "-t", help="CPU threads (default: physical cores).")
]
SystemOpt = Annotated[str | None, typer.Option("--system", help="System prompt for the chat template.")]
OfflineOpt = Annotated[
    bool, typer.Option("--offline", help="Never touch the network; use cached models only.")
]
ForceOpt = Annotated[
    bool, typer.Option("--force", help="Load even if the fit check says the models will not fit.")
]
StrictOpt = Annotated[
    bool,
    typer.Option(
        "--strict",
        help="Greedy output equal to --no-draft token for token. Without it, where a verify batch "
        "does not round like one-token decoding (beyond a few rows on a stock CPU build, every batch "
        "on GPUs) it leaves K/V that can tip a later near-tie, as in llama.cpp's own speculative "
        "modes. --strict keeps verify batches within the size that is bit-identical to one-token "
        "decoding (measured at load: every batch on the patched x86 build, where it costs nothing; "
        "none on GPUs, so plain speed) and re-decodes drifted K/V before a near-tie.",
    ),
]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Show llama.cpp's log and tracebacks.")]


_TEMPLATE_KWARGS_HELP = (
    "Extra variables for the chat template, a JSON object as llama-server takes it, e.g. "
    "'{\"enable_thinking\": false}': Qwen3-family templates then answer without thinking first."
)
TemplateKwargsOpt = Annotated[
    str | None,
    typer.Option("--chat-template-kwargs", metavar="JSON", help=_TEMPLATE_KWARGS_HELP, show_default=False),
]
ServeTemplateKwargsOpt = Annotated[  # serve's: the default under each request's own
    str | None,
    typer.Option(
        "--chat-template-kwargs",
        metavar="JSON",
        help=f"{_TEMPLATE_KWARGS_HELP} A request's own chat_template_kwargs go over these.",
        show_default=False,
    ),
]
TemplateKwargOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--chat-template-kwarg",
        metavar="KEY=VALUE",
        help="One extra chat-template variable, e.g. enable_thinking=false; VALUE is read as JSON, "
        "else as a string. Repeatable; over --chat-template-kwargs.",
        show_default=False,
    ),
]
NoColorOpt = Annotated[
    bool,
    typer.Option("--no-color", help="No colours (also when NO_COLOR is set or stdout is not a terminal)."),
]


#: What a command's `sampling` parameter defaults to before `sampling_options` replaces it (frozen).
DEFAULT_SAMPLING = SamplingParams()


def sampling_options(*, for_requests: bool = False) -> Callable[[F], F]:
    """Give a command one option per sampling setting, in place of its `sampling` parameter.

    The command declares `sampling: SamplingParams = DEFAULT_SAMPLING` where the options should
    appear in `--help`, and receives the checked `SamplingParams`. `for_requests` (serve) says in
    each help line that it is the default for HTTP requests that leave the field out.
    """

    def decorate(fn: F) -> F:
        sig = inspect.signature(fn, eval_str=True)  # the Annotated types Typer reads, not strings
        options = [
            inspect.Parameter(
                s.name,
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                # a per-token setting is ID=VALUE text, repeatable: a list of strings, None when not given
                default=None if s.per_token else s.default,
                annotation=Annotated[
                    list[str] | None if s.per_token else s.type,  # type: ignore[valid-type]
                    typer.Option(
                        s.flag,
                        help=f"{s.help} For requests that send no `{s.name}`." if for_requests else s.help,
                        metavar="ID=VALUE" if s.per_token else None,
                    ),
                ],
            )
            for s in SETTINGS
        ]
        if "sampling" not in sig.parameters:
            raise TypeError(f"{fn.__name__} has no `sampling` parameter to replace")
        params = [q for p in sig.parameters.values() for q in (options if p.name == "sampling" else [p])]

        @functools.wraps(fn)
        def command(*args: Any, **kwargs: Any) -> Any:
            given = {s.name: kwargs.pop(s.name) for s in SETTINGS if s.name in kwargs}
            try:
                for s in SETTINGS:
                    if s.per_token:
                        texts = given.pop(s.name, None)
                        if texts:
                            given[s.name] = s.parse_pairs(texts)
                sampling = SamplingParams(**given)
            except SettingError as exc:
                raise BadInput(str(exc)) from None
            return fn(*args, sampling=sampling, **kwargs)

        command.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command  # type: ignore[return-value]

    return decorate


def parse_k(k: str) -> int | None:
    """`-k` as given: a number of draft tokens (0..64), or None for `auto` (the cost model decides)."""
    if k == "auto":
        return None
    try:
        k_val = int(k)
    except ValueError:
        raise BadInput(f"-k/--draft-tokens must be a number >= 0 or `auto` (got {k!r})") from None
    check_range("-k/--draft-tokens", k_val, 0, 64)
    return k_val


def parse_template_kwargs(given: str | None, pairs: list[str] | None) -> dict[str, Any]:
    """--chat-template-kwargs JSON and each --chat-template-kwarg KEY=VALUE (over it) as the chat
    template's extra variables, checked as every front end checks them (decoding.template_vars), so a
    mistake is one line naming the flag before anything loads."""
    from ..decoding.template_vars import TemplateVarsError, check_template_vars

    merged: dict[str, Any] = {}
    try:
        if given is not None:
            try:
                value = json.loads(given)
            except ValueError as exc:
                raise BadInput(
                    f"--chat-template-kwargs is not valid JSON ({exc})",
                    "give a JSON object, e.g. '{\"enable_thinking\": false}'",
                ) from None
            merged.update(check_template_vars(value, "--chat-template-kwargs"))
        for pair in pairs or ():
            key, eq, text = pair.partition("=")
            if not eq or not key.strip():
                raise BadInput(
                    f"--chat-template-kwarg takes KEY=VALUE (got {pair!r})", "e.g. enable_thinking=false"
                )
            try:
                value = json.loads(text)
            except ValueError:
                value = text  # not JSON: the text itself, as a string
            merged.update(check_template_vars({key.strip(): value}, "--chat-template-kwarg"))
    except TemplateVarsError as exc:
        raise BadInput(str(exc)) from None
    return merged


@dataclass(frozen=True, slots=True)
class Options:
    """Generation and loading settings of one command invocation, validated when built.

    `drafts` are the --draft values as given; `drafts_to_load` applies --no-draft and the
    recommended default. `k` None means auto; `p_min` None means "follow the temperature"; `params`
    the sampling settings.
    """

    target: str
    drafts: tuple[str, ...] = ()
    no_draft: bool = False
    k: int | None = None
    p_min: float | None = None
    params: SamplingParams = field(default_factory=SamplingParams)  # checked when it was built
    seed: int | None = None
    max_tokens: int = MAX_TOKENS
    ctx_size: int = CTX_SIZE
    gpu_layers: int | None = None
    draft_gpu_layers: int | None = None
    threads: int | None = None
    system: str | None = None
    offline: bool = False
    force: bool = False
    verbose: bool = False
    strict: bool = False
    #: the chat template's extra variables (parse_template_kwargs)
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    #: --rpc as given (HOST:PORT[,...]); checked when built, probed when the models load
    rpc: str | None = None
    #: --tree-width as given (None: draft_tree_width's default)
    tree_width: int | None = None
    #: --draft-window as given (None: DRAFT_WINDOW)
    draft_window: int | None = None

    def __post_init__(self) -> None:
        """Check every number before anything slow happens, with the option's name in the message
        (the sampling settings are checked by `SamplingParams` itself)."""
        check_range("--max-tokens", self.max_tokens, 1)
        check_range("--ctx-size", self.ctx_size, 16)
        check_range("--threads", self.threads, 1)
        check_range("--tree-width", self.tree_width, 0, TREE_BRANCHES)
        check_range("--draft-window", self.draft_window, 0)
        if self.p_min is not None and not (0 <= self.p_min <= 1):
            raise BadInput(f"--draft-p-min must be in [0, 1] (got {self.p_min})")
        for spec in self.drafts:
            if is_model_free(spec) and ":" in spec:
                make(spec)  # its options, checked now: a typo is one line before anything loads
        if self.rpc is not None:
            from ..llama.rpc_wire import parse_endpoints  # standard library only

            parse_endpoints(self.rpc)

    @property
    def draft_p_min(self) -> float:
        """The draft confidence cut-off to load with: the user's, else the one for this temperature
        (none under -k auto, where the planner prices each further draft token)."""
        from ..decoding.drafters import default_p_min

        return self.p_min if self.p_min is not None else default_p_min(self.params, auto=self.k is None)

    @property
    def draft_tree_width(self) -> int:
        """Side nodes per round at most: the user's, else AUTO_TREE_WIDTH where the planner prices
        each (-k auto) and none with a fixed k, which would add them unpriced."""
        if self.tree_width is not None:
            return self.tree_width
        return AUTO_TREE_WIDTH if self.k is None else 0

    def drafts_to_load(self, announce: Callable[[str], None] | None = None) -> tuple[str, ...]:
        """The drafters to load: none with --no-draft, the --draft values, else the recommended ones
        (`announce` gets one line saying which, so the user knows why a draft model appears)."""
        if self.no_draft:
            return ()
        if self.drafts:
            return tuple(dict.fromkeys(self.drafts))  # a drafter given twice is loaded once
        from ..models.loader import default_drafts

        chosen = default_drafts(self.target)
        models = [d for d in chosen if not is_model_free(d)]
        if models and announce is not None:  # a draft model the user did not name: say which
            free = "".join(f" and `{d}`" for d in chosen if is_model_free(d))
            announce(
                f"using the recommended draft {' + '.join(models)}{free} where they pay "
                "(--no-draft for plain decoding)"
            )
        return chosen

    def load_config(self, drafts: tuple[str, ...]) -> LoadConfig:
        """What `loader.load` needs for these options and the chosen drafts."""
        from ..models.loader import LoadConfig

        return LoadConfig(
            target=self.target,
            drafts=drafts,
            ctx_size=self.ctx_size,
            gpu_layers=self.gpu_layers,
            draft_gpu_layers=self.draft_gpu_layers,
            threads=self.threads,
            p_min=self.draft_p_min,
            offline=self.offline or None,
            force=self.force,
            strict=self.strict,
            verbose=self.verbose,
            rpc=(self.rpc,) if self.rpc else (),
            tree_width=self.draft_tree_width,
            draft_window=self.draft_window if self.draft_window is not None else DRAFT_WINDOW,
        )
