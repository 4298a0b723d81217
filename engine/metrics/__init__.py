"""Pure metric functions on numpy arrays, label counts and strings; no models, no torch.

Modules:
  biasbench   T2I-BiasBench metrics, in "paper" and "reference" (released-code) mode
  diversity   Vendi score and mean pairwise cosine similarity of embeddings
  bootstrap   percentile bootstrap intervals over images
  intervals   small-N intervals (Jeffreys shares, Dirichlet posterior, BCa), sample sizes, headline claims
  agreement   Cohen's κ, confusion, recall; distributions corrected for an evaluator's confusion
  gap         MineTheGap bias score (reconstruction)
  tibet       TIBET concept histograms, CAS, CAS^CLIP, normalised MAD, Top-K
  biasconnect BiasConnect intersectional sensitivity, χ² edges; InterMit τ and γ
  paired      two sets on the same seeds compared seed by seed: paired intervals, McNemar, Stuart–Maxwell,
              Benjamini–Hochberg, equivalence (the bias check, Compare models)
  wordnet     synonyms read from a WordNet database directory
"""
