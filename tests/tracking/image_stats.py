"""Prints {"width", "height", "colors", "non_white"} of a PNG (Pillow, from the venv): how many
distinct colours it has and the fraction of pixels that are not near-white. A blank or
single-colour page has very few colours."""
import json
import sys

from PIL import Image

img = Image.open(sys.argv[1]).convert("RGB")
small = img.resize((img.width // 2, img.height // 2))
pixels = list(small.getdata())
non_white = sum(1 for p in pixels if min(p) < 235) / len(pixels)
print(json.dumps({"width": img.width, "height": img.height, "colors": len(set(pixels)), "non_white": non_white}))
