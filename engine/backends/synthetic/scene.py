"""Drawing a synthetic scene from its attributes, and reading the attributes back from pixels.

Both sides share the layout below: every attribute is drawn so that a few known pixel
positions decide it (the reader samples medians of small patches there), and the scene
still reads as a little picture in a gallery. Scenes are drawn on a 128x128 canvas; other
sizes are resized from it, and the reader resizes back before sampling.
"""
from __future__ import annotations

import hashlib
from functools import lru_cache

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from .world import World

CANVAS = 128
HORIZON = 88                                # wall/floor or sky/grass boundary

# person layout
HEAD_X, HEAD_Y, HEAD_R = 64, 40, 17
MOUTH_Y = HEAD_Y + 8
BODY_TOP = 62
BODY_HALF_WIDTH = {"slim": 15, "average": 21, "heavy": 29}
LONG_HAIR_HALF_WIDTH = 24
BADGE_BOX = (96, 4, 124, 32)

# colours
SKIN = {"light": (241, 206, 178), "medium": (196, 140, 94), "dark": (104, 66, 44)}
HAIR = {"young": (36, 26, 20), "middle-aged": (152, 94, 44), "old": (228, 228, 224)}
OBJECT_COLOUR = {"red": (206, 38, 38), "green": (38, 156, 64), "blue": (40, 84, 206)}
SUIT, SHIRT, TIE = (38, 44, 66), (246, 246, 246), (170, 30, 40)
TSHIRTS = {"orange": (245, 140, 40), "yellow": (240, 200, 50), "pink": (235, 105, 160),
           "teal": (40, 170, 170), "purple": (140, 90, 200)}
WALL, FLOOR, SKIRTING = (176, 200, 190), (150, 108, 70), (120, 84, 52)
SKY, GRASS, SUN = (140, 196, 238), (98, 168, 76), (250, 214, 80)
INK = (30, 24, 24)
MOUTH = (60, 12, 12)

# where the reader looks (x0, y0, x1, y1), inclusive-exclusive
PATCH_BACKGROUND_TOP = (1, 48, 5, 56)
PATCH_BACKGROUND_BOTTOM = (1, 104, 5, 112)
PATCH_HAIR = (62, 18, 67, 23)
PATCH_SKIN = (62, 40, 67, 44)
PATCH_CLOTHING = (52, 104, 57, 111)
PATCH_OBJECT = (60, 58, 69, 67)
PATCH_BADGE = (100, 24, 121, 29)
HAIR_SIDES = [(41, 43, 45, 49), (84, 43, 88, 49)]
BODY_ROW = (104, 111)
BODY_PROBES = {"average": (HEAD_X - 18, HEAD_X + 18), "heavy": (HEAD_X - 25, HEAD_X + 25)}


# what the renderer can draw: axis -> (kinds it is drawn for, values)
DRAWN_AXES = {
    "gender": ({"person"}, {"male", "female"}),
    "age": ({"person"}, set(HAIR)),
    "skin tone": ({"person"}, set(SKIN)),
    "clothing": ({"person"}, {"formal", "informal"}),
    "environment": ({"person", "object"}, {"indoors", "outdoors"}),
    "emotion": ({"person"}, {"happy", "serious", "sad"}),
    "bodytype": ({"person"}, set(BODY_HALF_WIDTH)),
    "color": ({"object"}, set(OBJECT_COLOUR)),
}
SHAPES = {"round", "balloon", "car", "truck", "tall", "flower", "animal", "kite", "umbrella", "boat", "mug", "sign", "box"}


def check_drawable(world: World) -> None:
    """Raise ValueError unless the renderer can draw every axis, value and shape of the
    table: the table may change probabilities, phrases, subjects and rules freely, but its
    axes and their values are the ones drawn here."""
    for name, (kinds, values) in DRAWN_AXES.items():
        axis = world.axes.get(name)
        if axis is None or set(axis.values) != values or set(axis.applies_to) != kinds:
            raise ValueError(f"synthetic world: the renderer draws axis '{name}' with values {sorted(values)} "
                             f"for {sorted(kinds)}; the table has {axis.values if axis else 'no such axis'}")
    extra = set(world.axes) - set(DRAWN_AXES)
    if extra:
        raise ValueError(f"synthetic world: the renderer cannot draw the axes {sorted(extra)}")
    for subject in world.subjects.values():
        if subject.kind == "object" and (subject.shape or "box") not in SHAPES:
            raise ValueError(f"synthetic world: object '{subject.name}' has shape '{subject.shape}'; "
                             f"shapes: {', '.join(sorted(SHAPES))}")
    badge_palette(world)


# -- subject badges: a colour code per subject plus its letters -------------------------------------
def badge_palette(world: World) -> dict[str, tuple[int, int, int]]:
    """A distinct badge colour per subject (table order), from a 5-level RGB grid."""
    return _badge_palette(tuple(world.subjects))


@lru_cache(maxsize=8)
def _badge_palette(names: tuple[str, ...]) -> dict[str, tuple[int, int, int]]:
    levels = (10, 70, 130, 190, 250)
    grid = [(r, g, b) for r in levels for g in levels for b in levels]
    # step through the grid with a stride coprime to its size so that neighbours in the
    # table get dissimilar colours
    colours = [grid[(i * 47 + 13) % len(grid)] for i in range(len(grid))]
    if len(names) > len(colours):
        raise ValueError(f"synthetic world: at most {len(colours)} subjects can be told apart by badge")
    return {name: colours[i] for i, name in enumerate(names)}


@lru_cache(maxsize=1)
def _badge_font():
    try:
        return ImageFont.load_default(size=10)
    except (TypeError, OSError):  # Pillow without FreeType: the small bitmap font
        return ImageFont.load_default()


@lru_cache(maxsize=256)
def _badge(colour: tuple[int, int, int], letters: str) -> Image.Image:
    """The badge (subject colour, outline, letters) as a small image to paste at BADGE_BOX."""
    x0, y0, x1, y1 = BADGE_BOX
    image = Image.new("RGB", (x1 - x0 + 1, y1 - y0 + 1), colour)
    draw = ImageDraw.Draw(image)
    draw.rectangle((0, 0, x1 - x0, y1 - y0), outline=INK, width=1)
    luminance = 0.299 * colour[0] + 0.587 * colour[1] + 0.114 * colour[2]
    text_colour = INK if luminance > 140 else (250, 250, 250)
    font = _badge_font()
    left, top, right, _ = draw.textbbox((0, 0), letters, font=font)
    draw.text(((x1 - x0) / 2 - (right - left) / 2 - left, 5 - top), letters, fill=text_colour, font=font)
    return image


# -- drawing --------------------------------------------------------------------------------------------
def draw_scene(world: World, attributes: dict, nuisance_seed: int, size: tuple[int, int] = (CANVAS, CANVAS)) -> Image.Image:
    """The RGB image of one scene. `nuisance_seed` picks what no axis decides (t-shirt colour)."""
    image = _background(attributes.get("environment", "indoors")).copy()
    draw = ImageDraw.Draw(image)
    subject = world.subjects[attributes["subject"]]
    if subject.kind == "person":
        _draw_person(draw, attributes, nuisance_seed)
    else:
        _draw_object(draw, subject.shape or "box", OBJECT_COLOUR[attributes["color"]])
    image.paste(_badge(badge_palette(world)[subject.name], subject.badge), BADGE_BOX[:2])
    if size != (CANVAS, CANVAS):
        image = image.resize(size, Image.Resampling.LANCZOS)
    return image


@lru_cache(maxsize=2)
def _background(environment: str) -> Image.Image:
    image = Image.new("RGB", (CANVAS, CANVAS), WALL)
    draw = ImageDraw.Draw(image)
    if environment == "outdoors":
        draw.rectangle((0, 0, CANVAS, HORIZON), fill=SKY)
        draw.rectangle((0, HORIZON, CANVAS, CANVAS), fill=GRASS)
        draw.ellipse((12, 10, 32, 30), fill=SUN)
        draw.ellipse((58, 8, 80, 18), fill=(250, 250, 250))      # a cloud
        draw.ellipse((68, 4, 90, 16), fill=(250, 250, 250))
    else:
        draw.rectangle((0, 0, CANVAS, HORIZON), fill=WALL)
        draw.rectangle((0, HORIZON, CANVAS, CANVAS), fill=FLOOR)
        draw.rectangle((0, HORIZON - 3, CANVAS, HORIZON), fill=SKIRTING)
        draw.rectangle((10, 12, 34, 36), fill=(236, 228, 200), outline=SKIRTING, width=2)   # a framed picture
        draw.polygon([(14, 32), (22, 20), (30, 32)], fill=(120, 150, 110))
    return image


def _draw_person(draw: ImageDraw.ImageDraw, a: dict, nuisance_seed: int) -> None:
    """Hair colour = age, hair length = gender, face = skin tone, torso width = bodytype,
    suit or t-shirt = clothing, mouth curve = emotion."""
    cx, cy, r = HEAD_X, HEAD_Y, HEAD_R
    hair = HAIR[a["age"]]
    skin = SKIN[a["skin tone"]]
    half = BODY_HALF_WIDTH[a["bodytype"]]
    if a["gender"] == "female":   # long hair, behind head and shoulders
        draw.rounded_rectangle((cx - LONG_HAIR_HALF_WIDTH, cy - 8, cx + LONG_HAIR_HALF_WIDTH, cy + 28),
                               radius=8, fill=hair)
    formal = a["clothing"] == "formal"
    outfit = SUIT if formal else list(TSHIRTS.values())[nuisance_seed % len(TSHIRTS)]
    draw.rounded_rectangle((cx - half, BODY_TOP, cx + half, CANVAS + 12), radius=12, fill=outfit)
    draw.rectangle((cx - 5, cy + 12, cx + 5, BODY_TOP + 2), fill=skin)                        # neck
    if formal:
        draw.polygon([(cx - 9, BODY_TOP), (cx + 9, BODY_TOP), (cx, BODY_TOP + 26)], fill=SHIRT)
        draw.polygon([(cx - 2, BODY_TOP + 2), (cx + 2, BODY_TOP + 2), (cx + 3, BODY_TOP + 20),
                      (cx, BODY_TOP + 24), (cx - 3, BODY_TOP + 20)], fill=TIE)
    else:
        draw.chord((cx - 8, BODY_TOP - 6, cx + 8, BODY_TOP + 7), 0, 180, fill=skin)          # crew neck
    draw.ellipse((cx - r - 2, cy - r - 7, cx + r + 2, cy + 8), fill=hair)                     # hair cap
    draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=skin)                                 # face
    draw.chord((cx - r, cy - r, cx + r, cy + r), 205, 335, fill=hair)                         # fringe
    for ex in (cx - 6, cx + 6):
        draw.ellipse((ex - 2, cy - 5, ex + 2, cy - 1), fill=INK)
    corners, middle = {"happy": (-3, 3), "serious": (0, 0), "sad": (3, -3)}[a["emotion"]]
    my = MOUTH_Y
    draw.line([(cx - 7, my + corners), (cx, my + middle), (cx + 7, my + corners)], fill=MOUTH, width=2)


def _draw_object(draw: ImageDraw.ImageDraw, shape: str, colour: tuple[int, int, int]) -> None:
    dark = (20, 20, 24)
    if shape == "round":
        draw.ellipse((30, 26, 98, 94), fill=colour, outline=dark)
        draw.line([(64, 26), (66, 14)], fill=(100, 64, 30), width=3)
    elif shape == "balloon":
        draw.line([(64, 96), (60, 112), (66, 124)], fill=dark, width=1)
        draw.ellipse((34, 22, 94, 96), fill=colour, outline=dark)
        draw.polygon([(60, 96), (68, 96), (64, 101)], fill=colour)
    elif shape == "car":
        draw.rounded_rectangle((34, 32, 94, 56), radius=8, fill=colour, outline=dark)
        draw.rectangle((40, 37, 61, 52), fill=(200, 225, 240))
        draw.rectangle((67, 37, 88, 52), fill=(200, 225, 240))
        draw.rounded_rectangle((16, 50, 112, 86), radius=8, fill=colour, outline=dark)
        _draw_wheels(draw, (38, 90), 86)
    elif shape == "truck":
        draw.rectangle((12, 30, 84, 86), fill=colour, outline=dark)
        draw.rounded_rectangle((86, 44, 116, 86), radius=5, fill=colour, outline=dark)
        draw.rectangle((92, 50, 110, 64), fill=(200, 225, 240))
        _draw_wheels(draw, (32, 98), 88)
    elif shape == "tall":
        draw.rounded_rectangle((44, 18, 84, 104), radius=10, fill=colour, outline=dark)
        draw.rectangle((50, 30, 54, 92), fill=tuple(min(255, c + 40) for c in colour))
    elif shape == "flower":
        draw.line([(64, 70), (64, 118)], fill=(60, 120, 50), width=4)
        for angle in range(0, 360, 72):
            px = 64 + 16 * np.cos(np.radians(angle))
            py = 50 + 16 * np.sin(np.radians(angle))
            draw.ellipse((px - 14, py - 14, px + 14, py + 14), fill=colour, outline=dark)
        draw.ellipse((46, 32, 82, 68), fill=colour)
        draw.ellipse((58, 44, 70, 56), fill=(250, 214, 80))
    elif shape == "animal":
        draw.polygon([(26, 62), (8, 44), (8, 82)], fill=colour, outline=dark)                  # tail
        draw.ellipse((20, 36, 110, 90), fill=colour, outline=dark)
        draw.ellipse((88, 48, 100, 60), fill=(250, 250, 250))
        draw.ellipse((92, 51, 98, 57), fill=dark)
    elif shape == "kite":
        draw.line([(64, 108), (50, 118), (70, 124)], fill=dark, width=1)
        draw.polygon([(64, 14), (104, 58), (64, 108), (24, 58)], fill=colour, outline=dark)
        draw.line([(64, 14), (64, 108)], fill=dark)
        draw.line([(24, 58), (104, 58)], fill=dark)
    elif shape == "umbrella":
        draw.pieslice((14, 24, 114, 112), 180, 360, fill=colour, outline=dark)
        draw.line([(66, 68), (66, 108)], fill=dark, width=3)
        draw.arc((56, 100, 68, 114), 0, 180, fill=dark, width=3)
    elif shape == "boat":
        draw.line([(70, 10), (70, 56)], fill=dark, width=2)
        draw.polygon([(72, 12), (72, 52), (104, 52)], fill=(250, 250, 250), outline=dark)
        draw.polygon([(14, 56), (114, 56), (98, 92), (30, 92)], fill=colour, outline=dark)
    elif shape == "mug":
        draw.ellipse((82, 46, 112, 86), outline=colour, width=7)
        draw.rounded_rectangle((30, 34, 92, 104), radius=6, fill=colour, outline=dark)
    elif shape == "sign":
        draw.line([(64, 90), (64, 124)], fill=(120, 120, 120), width=5)
        octagon = [(64 + 40 * np.cos(np.radians(22.5 + 45 * k)), 56 + 40 * np.sin(np.radians(22.5 + 45 * k)))
                   for k in range(8)]
        draw.polygon(octagon, fill=(250, 250, 250), outline=dark)
        inner = [(64 + 34 * np.cos(np.radians(22.5 + 45 * k)), 56 + 34 * np.sin(np.radians(22.5 + 45 * k)))
                 for k in range(8)]
        draw.polygon(inner, fill=colour)
    else:  # "box"
        draw.rounded_rectangle((24, 30, 104, 98), radius=6, fill=colour, outline=dark)
        draw.line([(24, 44), (104, 44)], fill=dark)


def _draw_wheels(draw: ImageDraw.ImageDraw, xs: tuple[int, ...], y: int) -> None:
    for x in xs:
        draw.ellipse((x - 10, y - 10, x + 10, y + 10), fill=(20, 20, 24))
        draw.ellipse((x - 4, y - 4, x + 4, y + 4), fill=(170, 170, 170))


# -- reading ----------------------------------------------------------------------------------------------
def image_digest(image: Image.Image) -> str:
    """A hex digest of the image's pixels, size and mode (seeds the per-image noise)."""
    return hashlib.sha256(f"{image.mode}{image.size}".encode() + image.tobytes()).hexdigest()


def _canvas_array(image: Image.Image) -> np.ndarray:
    image = image.convert("RGB")
    if image.size != (CANVAS, CANVAS):
        shrinking = image.width > CANVAS or image.height > CANVAS
        image = image.resize((CANVAS, CANVAS), Image.Resampling.BOX if shrinking else Image.Resampling.BILINEAR)
    return np.asarray(image, dtype=np.float32)


def _patch(pixels: np.ndarray, box: tuple[int, int, int, int]) -> np.ndarray:
    """The per-channel median colour of a box (robust to an edge or a letter inside it)."""
    x0, y0, x1, y1 = box
    values = np.sort(pixels[y0:y1, x0:x1].reshape(-1, 3), axis=0)
    return values[len(values) // 2]


def _nearest(colour: np.ndarray, palette: dict) -> tuple[str, float]:
    """(name, distance) of the palette colour nearest to `colour`."""
    names = list(palette)
    distances = np.linalg.norm(np.asarray([palette[n] for n in names], dtype=np.float32) - colour, axis=1)
    best = int(np.argmin(distances))
    return names[best], float(distances[best])


def _closer_to(colour: np.ndarray, target: np.ndarray, other: np.ndarray) -> bool:
    return float(np.linalg.norm(colour - target)) < float(np.linalg.norm(colour - other))


def read_scene(world: World, image: Image.Image) -> dict:
    """The attributes an image shows, read from its pixels: {"subject", "kind", axis: value for
    the axes of that kind, "outfit_colour" for persons}. An image that is not a synthetic
    scene reads as the default subject with whatever its pixels suggest."""
    pixels = _canvas_array(image)
    subject, distance = _nearest(_patch(pixels, PATCH_BADGE), badge_palette(world))
    if distance > 45:
        subject = world.default_subject
    kind = world.subjects[subject].kind
    top = _patch(pixels, PATCH_BACKGROUND_TOP)
    bottom = _patch(pixels, PATCH_BACKGROUND_BOTTOM)
    indoor_distance = np.linalg.norm(top - WALL) + np.linalg.norm(bottom - FLOOR)
    outdoor_distance = np.linalg.norm(top - SKY) + np.linalg.norm(bottom - GRASS)
    found = {"environment": "indoors" if indoor_distance <= outdoor_distance else "outdoors"}
    if kind == "object":
        found["color"] = _nearest(_patch(pixels, PATCH_OBJECT), OBJECT_COLOUR)[0]
    else:
        found.update(_read_person(pixels))
    axes = {a.name: found[a.name] for a in world.axes_for(kind)}      # in table order
    return {"subject": subject, "kind": kind, **axes, **{k: v for k, v in found.items() if k not in axes}}


def _read_person(pixels: np.ndarray) -> dict:
    """The person axes (and the outfit's colour name) read back from where _draw_person put them."""
    hair = _patch(pixels, PATCH_HAIR)
    skin = _patch(pixels, PATCH_SKIN)
    found = {"age": _nearest(hair, HAIR)[0], "skin tone": _nearest(skin, SKIN)[0]}

    long_sides = 0
    for box in HAIR_SIDES:
        beside = _patch(pixels, box)
        background = _patch(pixels, (PATCH_BACKGROUND_TOP[0], box[1], PATCH_BACKGROUND_TOP[2], box[3]))
        long_sides += _closer_to(beside, hair, background)
    found["gender"] = "female" if long_sides >= 1 else "male"

    clothing = _patch(pixels, PATCH_CLOTHING)
    outfit = _nearest(clothing, {"dark blue": SUIT, **TSHIRTS})[0]
    found["clothing"] = "formal" if outfit == "dark blue" else "informal"
    found["outfit_colour"] = outfit

    y0, y1 = BODY_ROW
    background = _patch(pixels, (PATCH_BACKGROUND_BOTTOM[0], y0, PATCH_BACKGROUND_BOTTOM[2], y1))
    covered = {}
    for width, xs in BODY_PROBES.items():
        covered[width] = sum(_closer_to(_patch(pixels, (x - 1, y0, x + 2, y1)), clothing, background) for x in xs)
    found["bodytype"] = "heavy" if covered["heavy"] >= 1 else ("average" if covered["average"] >= 1 else "slim")

    found["emotion"] = _read_mouth(pixels, skin)
    return found


def _read_mouth(pixels: np.ndarray, skin: np.ndarray) -> str:
    """Happy, serious or sad from the mouth's shape: how far its middle sits below its corners."""
    rows = np.arange(MOUTH_Y - 6, MOUTH_Y + 7)

    def centre_of_ink(x: int) -> float:
        column = pixels[rows[0]:rows[-1] + 1, x - 1:x + 2].mean(axis=1)
        ink = np.clip(np.linalg.norm(column - skin, axis=1) - 25.0, 0.0, None)
        return float(np.sum(rows * ink) / np.sum(ink)) if np.sum(ink) > 0 else float(MOUTH_Y)

    drop = centre_of_ink(HEAD_X) - (centre_of_ink(HEAD_X - 5) + centre_of_ink(HEAD_X + 5)) / 2
    if drop > 1.5:
        return "happy"
    if drop < -1.5:
        return "sad"
    return "serious"
