"""Workflows beside the methods: `doctor` (is this machine ready?), T2I-BiasBench on a caption
file (`biasbench`) and user-study packs (`study`)."""
