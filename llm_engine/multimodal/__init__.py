"""Images for vision-language models: decoding with limits, preprocessing as Transformers does it,
placeholder expansion in prompts, and the encoder-output cache."""
