"""Client dialects: codecs between other vendors' wire formats and the canonical chat form."""
