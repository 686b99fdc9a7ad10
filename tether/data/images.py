"""Images in data files: where a record's images are, reading and checking them, and their places in its text.

A record carries its images in an ``images`` field (a list, or one image), in order; each is a path (relative to the
data file), a ``data:image/...;base64,`` URI, raw bytes, base64 text, or a ``{"bytes": ..., "path": ...}`` object as
Hugging Face datasets stores an Image column. Each image has a place in the text:
- TRL's shape: chat content parts ``{"type": "image"}`` (an image part may also hold its image: ``{"type": "image",
  "image": ...}``, or OpenAI's ``{"type": "image_url", "image_url": {"url": ...}}``);
- LLaMA-Factory's: ``<image>`` in a message's (or a plain prompt's) text;
- neither: the images go first in the first user turn (or the plain prompt), as both projects do.
The placeholders must match the images one for one; every error names the record and the field (docs/data.md
"Images"). Last, the processor's pixel tensors of a micro-batch's examples, joined (collate_vision).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import re
from pathlib import Path

import torch

from tether.errors import DataError
from tether.models.vision import join_vision

IMAGES = "images"
PLACEHOLDER = "<image>"  # LLaMA-Factory's placeholder in text
# How the base64 text of a PNG, JPEG, GIF and WebP file starts (their magic numbers, encoded): any other string
# is a path
BASE64_STARTS = ("iVBORw0KGgo", "/9j/", "R0lGOD", "UklGR")
_WHERE = re.compile(r"^(.*?)(:\d+| record \d+| row \d+)$")


def folder_of(where: str) -> Path:
    """The folder of the data file a record came from (``path:line``, ``path record N``, ``path row N``): where its
    relative image paths start."""
    match = _WHERE.match(where)
    return Path(match.group(1) if match else where).parent


def _absolute(ref, folder: Path):
    """An image reference with a relative path made absolute (anything else as it is)."""
    if isinstance(ref, dict) and isinstance(ref.get("path"), str) and ref.get("bytes") is None:
        return {**ref, "path": _absolute(ref["path"], folder)}
    if isinstance(ref, str) and ref and not ref.startswith(("data:", *BASE64_STARTS)) and not Path(ref).is_absolute():
        return str((folder / ref).resolve())
    return ref


def resolve_image_refs(fields: dict, where: str) -> dict:
    """The record with every image path (in its ``images`` field and inside image parts) absolute."""
    folder, out = folder_of(where), dict(fields)
    if fields.get(IMAGES) not in (None, "", []):
        refs = fields[IMAGES]
        out[IMAGES] = (
            [_absolute(r, folder) for r in refs] if isinstance(refs, (list, tuple)) else _absolute(refs, folder)
        )
    for name in ("prompt", "messages"):
        if isinstance(fields.get(name), list):
            out[name] = [_message_absolute(m, folder) for m in fields[name]]
    return out


def _message_absolute(message, folder: Path):
    if not isinstance(message, dict) or not isinstance(message.get("content"), list):
        return message
    parts = []
    for part in message["content"]:
        if is_image_part(part) and part.get("type") == "image" and part.get("image") is not None:
            part = {**part, "image": _absolute(part["image"], folder)}
        elif is_image_part(part) and isinstance(part.get("image_url"), dict):
            part = {**part, "image_url": {**part["image_url"], "url": _absolute(part["image_url"].get("url"), folder)}}
        parts.append(part)
    return {**message, "content": parts}


def is_image_part(part) -> bool:
    return isinstance(part, dict) and part.get("type") in ("image", "image_url")


def message_content(message, where: str):
    """A message whose content is a list of parts: text parts joined into one string when there is no image part;
    with image parts, the list kept as text and image parts (an inline image kept in its part)."""
    if not isinstance(message, dict) or not isinstance(message.get("content"), list):
        return message
    parts = []
    for part in message["content"]:
        if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif is_image_part(part):
            parts.append(part)
        else:
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise DataError(f"{where}.content has a {kind!r} part; tether reads text and image parts")
    if not any(is_image_part(p) for p in parts):
        return {**message, "content": "".join(p["text"] for p in parts)}
    return {**message, "content": parts}


def has_images(fields: dict) -> bool:
    """Whether a record carries images: an ``images`` field that is not empty, or an image part in its messages."""
    if fields.get(IMAGES) not in (None, [], ""):
        return True
    return any(
        isinstance(m, dict) and isinstance(m.get("content"), list) and any(is_image_part(p) for p in m["content"])
        for name in ("messages", "prompt", "completion", "chosen", "rejected")
        if isinstance(fields.get(name), list)
        for m in fields[name]
    )


def _inline_image(part: dict):
    if part.get("type") == "image_url":
        url = part.get("image_url")
        return url.get("url") if isinstance(url, dict) else url
    return part.get("image")


def _split_placeholders(text: str) -> list[dict]:
    pieces = text.split(PLACEHOLDER)
    parts = []
    for i, piece in enumerate(pieces):
        if i:
            parts.append({"type": "image"})
        if piece:
            parts.append({"type": "text", "text": piece})
    return parts


def place_images(messages: list[dict], images: list, where: str, field: str) -> tuple[list[dict], list]:
    """(the conversation with one bare ``{"type": "image"}`` part per image, the images in order). Images come
    from the ``images`` field or from the parts themselves (not both); ``<image>`` in a message's text is a part;
    a conversation with images and no place for them gets them at the start of its first user turn."""
    inline = [
        _inline_image(p)
        for m in messages
        if isinstance(m.get("content"), list)
        for p in m["content"]
        if is_image_part(p) and _inline_image(p) is not None
    ]
    if inline and images:
        raise DataError(f"{where}: {field} has images inside its parts and an 'images' field too; give them once")
    images = inline or images
    placed = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, str) and PLACEHOLDER in content:
            content = _split_placeholders(content)
        elif isinstance(content, list):
            content = [{"type": "image"} if is_image_part(p) else p for p in content]
        placed.append({**m, "content": content})
    count = sum(1 for m in placed if isinstance(m["content"], list) for p in m["content"] if p["type"] == "image")
    if count == 0 and images:
        first = next((i for i, m in enumerate(placed) if m.get("role") == "user"), None)
        if first is None:
            raise DataError(f"{where}: {field} has {len(images)} image(s) and no user turn to show them in")
        text = placed[first]["content"]
        parts = text if isinstance(text, list) else ([{"type": "text", "text": text}] if text else [])
        placed[first] = {**placed[first], "content": [{"type": "image"}] * len(images) + parts}
        count = len(images)
    if count != len(images):
        raise DataError(
            f"{where}: {field} has {count} image placeholder(s) ({PLACEHOLDER} or image parts) for {len(images)} "
            f"image(s) in '{IMAGES}'; they must match one for one"
        )
    return placed, images


def place_in_text(text: str, images: list, image_text: str, where: str, field: str) -> str:
    """A plain prompt's ``<image>`` placeholders as the processor's own image token (``image_text``); without any,
    the images go first. The count must match."""
    count = text.count(PLACEHOLDER)
    if count == 0:
        return image_text * len(images) + text
    if count != len(images):
        raise DataError(
            f"{where}: {field} has {count} {PLACEHOLDER} placeholder(s) for {len(images)} image(s) in '{IMAGES}'"
        )
    return text.replace(PLACEHOLDER, image_text)


def image_list(fields: dict, where: str) -> list:
    value = fields.get(IMAGES)
    if value in (None, ""):
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _bytes_of(ref, base: Path, where: str) -> bytes:
    if isinstance(ref, (bytes, bytearray)):
        return bytes(ref)
    if isinstance(ref, dict):
        if ref.get("bytes") is not None:
            return _bytes_of(ref["bytes"], base, where)
        if isinstance(ref.get("path"), str):
            return _bytes_of(ref["path"], base, where)
        raise DataError(f"{where}: an image object needs 'bytes' or 'path', got keys {sorted(ref)}")
    if not isinstance(ref, str) or not ref:
        raise DataError(f"{where}: an image is a path, a data: URI, bytes or base64 text, not {type(ref).__name__}")
    if ref.startswith("data:"):
        header, _, payload = ref.partition(",")
        if ";base64" not in header:
            raise DataError(f"{where}: a data: URI image must be base64 ('data:image/png;base64,...')")
        ref = payload
    elif not ref.startswith(BASE64_STARTS):
        path = Path(ref) if Path(ref).is_absolute() else base / ref
        if not path.is_file():
            raise DataError(
                f"{where}: image file {ref!r} not found (looked for {path}; base64 text is read as such when it is "
                "a PNG, JPEG, GIF or WebP file's)"
            )
        return path.read_bytes()
    try:
        return base64.b64decode(ref, validate=True)
    except (binascii.Error, ValueError):
        raise DataError(f"{where}: image text is neither a file path nor base64 ({ref[:40]!r}...)") from None


def open_image(ref, base: Path, where: str, max_pixels: int):
    """The image ``ref`` names, decoded, in RGB; unreadable, or over ``max_pixels``, is a DataError naming
    ``where``."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(ref, Image.Image):
        image = ref
    else:
        data = _bytes_of(ref, base, where)
        try:
            image = Image.open(io.BytesIO(data))
            width, height = image.size
            if width * height > max_pixels:
                raise DataError(
                    f"{where}: the image is {width}x{height} = {width * height} pixels, over max_image_pixels="
                    f"{max_pixels}"
                )
            image.load()
        except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as err:
            raise DataError(f"{where}: not a readable image ({type(err).__name__}: {str(err)[:200]})") from None
    width, height = image.size
    if width * height > max_pixels:
        raise DataError(f"{where}: the image is {width}x{height}, over max_image_pixels={max_pixels}")
    return image.convert("RGB")


def load_images(refs: list, base: Path, where: str, max_pixels: int) -> list:
    return [open_image(ref, base, f"{where}: {IMAGES}[{i}]", max_pixels) for i, ref in enumerate(refs)]


THUMBNAIL_SIDE = 64  # pixels: the longest side of a report's thumbnail
_THUMBNAILS: dict[str, str] = {}  # an inline image's thumbnail, by the digest of its bytes: made once per image


def thumbnail_uri(image) -> str:
    """A PIL image as a ``data:`` URI of a PNG at most THUMBNAIL_SIDE pixels a side (the report shows it)."""
    small = image.copy()
    small.thumbnail((THUMBNAIL_SIDE, THUMBNAIL_SIDE))
    buffer = io.BytesIO()
    small.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def sample_image_ref(ref) -> str:
    """How samples.jsonl names an image of a prompt row (whose paths are absolute: data/prompts.py): its path, or,
    for an image held in the data itself, a thumbnail ``data:`` URI (a few hundred bytes, not the image)."""
    if isinstance(ref, dict) and ref.get("bytes") is None and isinstance(ref.get("path"), str):
        return ref["path"]
    if isinstance(ref, str) and ref and not ref.startswith(("data:", *BASE64_STARTS)):
        return ref
    data = _bytes_of(ref, Path("."), "an inline image")
    key = hashlib.sha256(data).hexdigest()
    if key not in _THUMBNAILS:
        _THUMBNAILS[key] = thumbnail_uri(open_image(data, Path("."), "an inline image", 2**62))
    return _THUMBNAILS[key]


def collate_vision(examples: list, width: int) -> dict[str, torch.Tensor]:
    """The micro-batch's pixel tensors of ``examples`` (each with its ``vision``, or None), rows right-padded to
    ``width``: join_vision."""
    return join_vision([ex.vision for ex in examples], width)
