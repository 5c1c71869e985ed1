"""ModelConfig fields that became zoo options (lm/zoo): a config saved with them loads as the option node, and an
override that names one is refused in one line naming its new spelling. The moves: model.embedding|output's
choices (model/embedding=adaptive, model/output=...), model.factorized_embedding (model/embedding=factorized),
ReZero/Fixup's targets, and the nodes model.rnn (with model.arch=rnn) and model.electra, which became
model/family=lstm|gru|rnn|electra. Also the option fields added since whose default is not how an older config ran
(ADDED_FIELDS: Funnel's separate_cls): such a node loads with the value it ran with.

This table is data: the core names the zoo's targets as strings (model_from_saved imports the module a
`_target_` names) and never imports the zoo.
"""

# The fields model/embedding=adaptive and model/output=adaptive_softmax|mixture_of_softmaxes replaced, with their
# defaults, and the option field each one became.
_ADAPTIVE = {"adaptive_cutoffs": ("cutoffs", None), "adaptive_div_value": ("div_value", 4.0)}
_ADAPTIVE_SOFTMAX = {
    **_ADAPTIVE,
    "adaptive_tail_projection": ("tail_projection", True),
    "adaptive_head_bias": ("head_bias", False),
}
_MOS = {"mos_components": ("components", 4)}
_OLD_EMBEDDINGS = {"adaptive": ("lm.zoo.adaptive.AdaptiveInput", _ADAPTIVE)}
_OLD_OUTPUTS = {
    "adaptive_softmax": ("lm.zoo.adaptive.adaptive_softmax", _ADAPTIVE_SOFTMAX),
    "mixture_of_softmaxes": ("lm.zoo.mos.MixtureOfSoftmaxes", _MOS),
}
_OLD_FIELDS = {**_ADAPTIVE_SOFTMAX, **_MOS}
# model.factorized_embedding=<rank> (0: off) became model/embedding=factorized with model.embedding.rank.
_FACTORIZED = "lm.zoo.factorized.factorized_table"
# The typed nodes that became model/family options: node -> the option's `_target_`.
_OLD_FAMILIES = {"rnn": "lm.zoo.rnn.RNNLM", "electra": "lm.zoo.electra.ElectraLM"}

# Option fields added since with a default unlike how a config saved before them ran: `_target_` -> {field: the value
# that config ran with}. Funnel's separate_cls (on by default: the authors' [CLS] kept out of pooling) was off before
# it existed. A saved node without the field loads with that value, and resume compares it so (a run continued with
# today's default is refused, naming the field).
ADDED_FIELDS = {"lm.zoo.funnel.funnel_stack": {"separate_cls": False}}

# `_target_`s of options that moved to the zoo: a config saved before names the old home.
MOVED_TARGETS = {
    "lm.model.norms.rezero_norm": "lm.zoo.residual.rezero_norm",
    "lm.model.norms.fixup_norm": "lm.zoo.residual.fixup_norm",
}

# lm train overrides of those fields -> what to write now.
MOVED = {
    "model.embedding": "model/embedding=adaptive (model.embedding=standard is the default: drop it)",
    "model.output": "model/output=adaptive_softmax or model/output=mixture_of_softmaxes (softmax is the default: "
    "drop it)",
    **{
        f"model.{old}": f"model.embedding.{new} (model/embedding=adaptive) or model.output.{new} "
        f"(model/output=adaptive_softmax)"
        for old, (new, _) in _ADAPTIVE.items()
    },
    **{
        f"model.{old}": f"model.output.{new} (model/output=adaptive_softmax)"
        for old, (new, _) in _ADAPTIVE_SOFTMAX.items()
        if old not in _ADAPTIVE
    },
    "model.mos_components": "model.output.components (model/output=mixture_of_softmaxes)",
    "model.arch": "model=lstm, model=gru or model=rnn (model/family=lstm|gru|rnn with model.arch=decoder)",
    "model.rnn": "model.family (model=lstm|gru|rnn; model.family=null for none)",
    "model.electra": "model.family (model/family=electra; model.family=null for none)",
    "model/electra": "model/family=electra",
    "model.factorized_embedding": "model/embedding=factorized model.embedding.rank=<rank> (0, off: drop it)",
}
# Nodes whose fields moved with them: model.rnn.hidden=512 -> model.family.hidden=512.
_MOVED_NODES = {"model.rnn.": "model.family.", "model.electra.": "model.family."}
# The values of model.embedding / model.output that were Enum choices (anything else is a new-style override), and
# model.arch's value that went.
_OLD_CHOICES = {
    "model.embedding": ("standard", *_OLD_EMBEDDINGS),
    "model.output": ("softmax", *_OLD_OUTPUTS),
    "model.arch": ("rnn",),
}


def moved_override(arg: str) -> str | None:
    """The one-line refusal of a command-line override spelled as before the move, or None."""
    key, eq, value = arg.lstrip("+~").partition("=")
    if not eq:
        return None
    for old, new in _MOVED_NODES.items():
        if key.startswith(old):
            return f"{arg}: this option moved to the zoo (lm/zoo); write {new}{key.removeprefix(old)}={value}"
    if key not in MOVED:
        return None
    if key in _OLD_CHOICES and not set(value.split(",")) & set(_OLD_CHOICES[key]):
        return None  # model.output=null, or a value of the new node: Hydra judges it
    return f"{arg}: this option moved to the zoo (lm/zoo); write {MOVED[key]}"


def upgrade_saved(data: dict) -> dict:
    """A saved model node (a plain dict) with the old fields turned into the option nodes they became."""
    data = dict(data)
    for node, target in _OLD_FAMILIES.items():
        fields = data.pop(node, None)
        if isinstance(fields, dict):  # saved before model/family: the node's fields are the option's
            data["family"] = {"_target_": target, **fields}
    if data.get("arch") == "rnn":  # a recurrent LM reads left to right: the decoder's objective and pooling
        data["arch"] = "decoder"
    old = {name: data.pop(name) for name in _OLD_FIELDS if name in data}
    for slot, kinds, plain in (("embedding", _OLD_EMBEDDINGS, "standard"), ("output", _OLD_OUTPUTS, "softmax")):
        kind = data.get(slot)
        if not isinstance(kind, str):
            continue  # None or an option node: saved after the move
        if kind == plain:
            data[slot] = None
            continue
        target, fields = kinds[kind]
        data[slot] = {"_target_": target, **{new: old.get(name, default) for name, (new, default) in fields.items()}}
    rank = data.pop("factorized_embedding", 0)
    if rank and data.get("embedding") is None:  # the two could not be combined: the table was the plain one
        data["embedding"] = {"_target_": _FACTORIZED, "rank": rank}
    return {k: _with_added_fields(v) for k, v in data.items()}


def _with_added_fields(node):
    """An option node saved before one of ADDED_FIELDS existed, with the value it ran with."""
    if not isinstance(node, dict) or node.get("_target_") not in ADDED_FIELDS:
        return node
    return {**ADDED_FIELDS[node["_target_"]], **node}


def upgrade_for_comparison(data: dict) -> dict:
    """A saved model node spelled as a config composed now spells it, for the resume checks (lm/core/resume.py):
    upgrade_saved's option nodes and every moved `_target_` renamed, as model_from_saved reads them. Compared raw,
    a run saved before the move (model.embedding: standard, today's null) could never resume."""
    return _renamed_targets(upgrade_saved(data))


def _renamed_targets(node):
    if not isinstance(node, dict):
        return node
    return {k: MOVED_TARGETS.get(v, v) if k == "_target_" else _renamed_targets(v) for k, v in node.items()}
