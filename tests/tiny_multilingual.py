"""A tiny random-weight Hunyuan-DiT pipeline (Chinese and English, issue 45), written with
save_pretrained and loaded back through the diffusers backend's real from_pretrained: a BERT text
encoder with a WordPiece vocabulary of a few words in both scripts, an mT5-style T5 encoder with a
Unigram vocabulary built in-process, a 2-layer HunyuanDiT2DModel and a 4-block VAE. No hub."""
from __future__ import annotations

from pathlib import Path

from engine.backends.base import ModelSpec

WORDS = ["a", "photo", "of", "the", "face", "doctor", "nurse", "ein", "foto", "von", "einem", "arzt", "一", "张", "医",
         "生", "的", "照", "片"]


def build_tiny_hunyuandit(root: str | Path, *, name: str = "tiny-hunyuandit") -> ModelSpec:
    """Writes the pipeline to root/name once; returns its ModelSpec."""
    path = Path(root) / name
    if (path / "model_index.json").is_file():
        return ModelSpec("diffusers", str(path))
    import torch
    from diffusers import AutoencoderKL, DDPMScheduler, HunyuanDiT2DModel, HunyuanDiTPipeline
    from transformers import BertConfig, BertModel, BertTokenizer, T5Config, T5EncoderModel, T5Tokenizer

    torch.manual_seed(0)
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    bert_tokenizer = BertTokenizer(vocab={w: i for i, w in enumerate(specials + WORDS)}, model_max_length=77)
    bert = BertModel(BertConfig(vocab_size=len(specials) + len(WORDS), hidden_size=32, num_hidden_layers=2,
                                num_attention_heads=4, intermediate_size=37, max_position_embeddings=128),
                     add_pooling_layer=False)
    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)] + [(f"▁{w}", -1.0) for w in WORDS] + [(w, -2.0) for w in WORDS]
    t5_tokenizer = T5Tokenizer(vocab=pieces, extra_ids=0, model_max_length=256)
    t5 = T5EncoderModel(T5Config(vocab_size=len(pieces), d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4,
                                 feed_forward_proj="gated-gelu", decoder_start_token_id=0, pad_token_id=0))
    transformer = HunyuanDiT2DModel(sample_size=16, num_layers=2, patch_size=2, attention_head_dim=8,
                                    num_attention_heads=3, in_channels=4, cross_attention_dim=32,
                                    cross_attention_dim_t5=32, pooled_projection_dim=16, hidden_size=24,
                                    activation_fn="gelu-approximate", text_len=77, text_len_t5=256)
    # four blocks: the pipeline assumes the VAE's scale factor of 8
    vae = AutoencoderKL(block_out_channels=(8, 8, 16, 16), down_block_types=("DownEncoderBlock2D",) * 4,
                        up_block_types=("UpDecoderBlock2D",) * 4, latent_channels=4, norm_num_groups=8,
                        layers_per_block=1, sample_size=64)
    pipe = HunyuanDiTPipeline(vae=vae, text_encoder=bert, tokenizer=bert_tokenizer, transformer=transformer,
                              scheduler=DDPMScheduler(), safety_checker=None, feature_extractor=None,
                              requires_safety_checker=False, text_encoder_2=t5, tokenizer_2=t5_tokenizer)
    pipe.save_pretrained(path)
    return ModelSpec("diffusers", str(path))
