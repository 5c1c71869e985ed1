"""Which Hugging Face config fields the converter understands, per family; everything else is refused.

A field is *handled* when lm/model/hf_families.py or hf_encoders.py maps it (or refuses its unsupported values),
*inert* when it cannot change the logits of an eval-mode forward pass (dropout, token ids,
bookkeeping). Any other field whose value differs from the family's default config could change
the maths, so `check_fields` refuses it by name and value rather than convert silently wrong.
"""

# Inert for every family: bookkeeping, generation defaults, token ids, training-only settings.
INERT: frozenset[str] = frozenset(
    {
        "transformers_version",
        "architectures",
        "model_type",
        "_name_or_path",
        "name_or_path",
        "dtype",
        "torch_dtype",
        "output_hidden_states",
        "output_attentions",
        "return_dict",
        "use_cache",
        "id2label",
        "label2id",
        "num_labels",
        "problem_type",
        "finetuning_task",
        "tokenizer_class",
        "prefix",
        "task_specific_params",
        "initializer_range",
        "initializer_factor",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "sep_token_id",
        "decoder_start_token_id",
        "gradient_checkpointing",
        "chunk_size_feed_forward",  # chunking the FFN over positions: same products
        "max_length",
        "output_past",
        "is_encoder_decoder",
        "_attn_implementation_autoset",
        "classifier_dropout",
    }
)

HANDLED: dict[str, frozenset[str]] = {
    "gpt2": frozenset(
        {
            "vocab_size",
            "n_embd",
            "n_layer",
            "n_head",
            "n_positions",
            "n_inner",
            "activation_function",
            "layer_norm_epsilon",
            "scale_attn_weights",
            "scale_attn_by_inverse_layer_idx",
            "tie_word_embeddings",
        }
    ),
    "llama": frozenset(
        {
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "hidden_act",
            "max_position_embeddings",
            "rms_norm_eps",
            "tie_word_embeddings",
            "rope_parameters",
            "rope_scaling",
            "rope_theta",
            "attention_bias",
            "mlp_bias",
        }
    ),
    "bert": frozenset(
        {
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "hidden_act",
            "max_position_embeddings",
            "type_vocab_size",
            "layer_norm_eps",
            "position_embedding_type",
            "tie_word_embeddings",
        }
    ),
    "esm": frozenset(
        {
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "max_position_embeddings",
            "layer_norm_eps",
            "position_embedding_type",
            "rope_theta",
            "emb_layer_norm_before",
            "tie_word_embeddings",
        }
    ),
    "t5": frozenset(
        {
            "vocab_size",
            "d_model",
            "d_kv",
            "d_ff",
            "num_layers",
            "num_decoder_layers",
            "num_heads",
            "relative_attention_num_buckets",
            "relative_attention_max_distance",
            "layer_norm_epsilon",
            "feed_forward_proj",
            "dense_act_fn",
            "is_gated_act",
            "scale_decoder_outputs",
            "tie_word_embeddings",
        }
    ),
}

# Inert for one family only.
FAMILY_INERT: dict[str, frozenset[str]] = {
    # reorder_and_upcast_attn computes the scores in fp32: identical maths in an fp32 forward.
    "gpt2": frozenset(
        {
            "resid_pdrop",
            "embd_pdrop",
            "attn_pdrop",
            "n_ctx",
            "reorder_and_upcast_attn",
            "summary_type",
            "summary_use_proj",
            "summary_activation",
            "summary_proj_to_labels",
            "summary_first_dropout",
        }
    ),
    # pretraining_tp only slices the same matmuls (transformers 5 ignores it).
    "llama": frozenset({"attention_dropout", "pretraining_tp"}),
    "bert": frozenset({"hidden_dropout_prob", "attention_probs_dropout_prob"}),
    # mask_token_id matters only with token_dropout (refused unless False, its default); vocab_list names tokens
    "esm": frozenset({"hidden_dropout_prob", "attention_probs_dropout_prob", "mask_token_id", "vocab_list"}),
    "t5": frozenset({"dropout_rate", "n_positions"}),
}


def check_fields(family: str, hf_config) -> None:
    """Refuse any field outside the family's handled and inert lists whose value is not the default."""
    ours = hf_config.to_dict()
    default = type(hf_config)().to_dict()
    known = HANDLED[family] | FAMILY_INERT[family] | INERT
    odd = {k: v for k, v in ours.items() if k not in known and (k not in default or default[k] != v)}
    if odd:
        fields = ", ".join(f"{k}={v!r}" for k, v in sorted(odd.items()))
        raise ValueError(
            f"Hugging Face {family} config field(s) {fields} may change the forward pass and are not converted; "
            f"lm.model.hf_fields.HANDLED['{family}'] lists those that are. Convert a model without them, or, if "
            f"you know a field does not change the logits, set it to its default ({type(hf_config).__name__}()) first"
        )
