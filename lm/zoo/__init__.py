"""The zoo: paper variants that plug into the core model (lm/model) through its one registry
(lm/model/registry.py). The core never imports this package; the config root (lm/config.py's
register_train_configs) imports it before Hydra composes a config, so every option below registers
its schema first. A saved config naming a zoo class by `_target_` imports its module on load
(lm/model/config.py's model_from_saved).

One module per variant: its option schema(s) (registered with lm.model.registry.register), its modules,
and its checks; its YAML lives in conf/model/<slot>/. docs/architecture.md has the recipe.
"""

# each registers its options when imported
from lm.zoo import (  # noqa: F401
    adaptive,
    conv_attn,
    electra,
    evolved,
    factorized,
    funnel,
    mos,
    pkm,
    residual,
    rnn,
    scores,
    sharing,
    synthesizer,
    transparent,
    weighted,
)
