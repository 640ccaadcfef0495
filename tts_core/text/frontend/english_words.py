"""English words: the vocabulary the English rules say things with, and numbers as words (num2words)."""

from __future__ import annotations

from num2words import num2words

MAX_CARDINAL_DIGITS = 15  # longer digit strings are read digit by digit
DIGIT_WORDS = {str(digit): num2words(digit, lang="en") for digit in range(10)}
ORDINAL_DIGIT_WORDS = {str(digit): num2words(digit, lang="en", to="ordinal") for digit in range(10)}
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")
MONTH_NAMES = {**{month: month for month in MONTHS}, **{month[:3]: month for month in MONTHS}, "Sept": "September"}
CURRENCIES = {"$": ("dollar", "dollars", "cent", "cents"), "€": ("euro", "euros", "cent", "cents"),
              "£": ("pound", "pounds", "penny", "pence"), "¥": ("yen", "yen", "sen", "sen"),
              "₹": ("rupee", "rupees", "paisa", "paise")}
SCALE_WORDS = frozenset({"thousand", "million", "billion", "trillion"})  # after a space: $1.5 million
SCALE_SUFFIXES = {"k": "thousand", "K": "thousand", "m": "million", "M": "million", "mn": "million",
                  "b": "billion", "B": "billion", "bn": "billion", "T": "trillion", "tn": "trillion"}  # $2bn
UNITS = {
    "km": ("kilometer", "kilometers"), "m": ("meter", "meters"), "cm": ("centimeter", "centimeters"),
    "mm": ("millimeter", "millimeters"), "mi": ("mile", "miles"), "ft": ("foot", "feet"), "yd": ("yard", "yards"),
    "kg": ("kilogram", "kilograms"), "g": ("gram", "grams"), "mg": ("milligram", "milligrams"),
    "lb": ("pound", "pounds"), "lbs": ("pound", "pounds"), "oz": ("ounce", "ounces"), "l": ("liter", "liters"),
    "L": ("liter", "liters"), "ml": ("milliliter", "milliliters"), "mL": ("milliliter", "milliliters"),
    "km/h": ("kilometer per hour", "kilometers per hour"), "kph": ("kilometer per hour", "kilometers per hour"),
    "mph": ("mile per hour", "miles per hour"), "m/s": ("meter per second", "meters per second"),
    "ms": ("millisecond", "milliseconds"), "sec": ("second", "seconds"), "min": ("minute", "minutes"),
    "h": ("hour", "hours"), "hr": ("hour", "hours"), "hrs": ("hour", "hours"), "Hz": ("hertz", "hertz"),
    "kHz": ("kilohertz", "kilohertz"), "MHz": ("megahertz", "megahertz"), "GHz": ("gigahertz", "gigahertz"),
    "KB": ("kilobyte", "kilobytes"), "kB": ("kilobyte", "kilobytes"), "MB": ("megabyte", "megabytes"),
    "GB": ("gigabyte", "gigabytes"), "TB": ("terabyte", "terabytes"), "Mbps": ("megabit per second",
    "megabits per second"), "Gbps": ("gigabit per second", "gigabits per second"), "W": ("watt", "watts"),
    "kW": ("kilowatt", "kilowatts"), "kWh": ("kilowatt hour", "kilowatt hours"), "V": ("volt", "volts"),
    "mAh": ("milliamp hour", "milliamp hours"), "px": ("pixel", "pixels"),
}
DEGREES = {"C": ("degree Celsius", "degrees Celsius"), "F": ("degree Fahrenheit", "degrees Fahrenheit"),
           "": ("degree", "degrees")}
TITLES = {"Dr": "Doctor", "Mr": "Mister", "Mrs": "Missus", "Ms": "Miz", "Prof": "Professor", "Jr": "Junior",
          "Sr": "Senior", "Mt": "Mount"}  # before a name: as written, with the period
PHRASES = {"e.g": "for example", "i.e": "that is", "etc": "et cetera", "vs": "versus", "approx": "approximately"}
SYMBOLS = {"&": "and", "+": "plus", "=": "equals", "@": "at", "/": "slash", "%": "percent"}
PAUSES = frozenset("*_|\\^`{}[]<>#~")  # markup left over: a space, not a word
ORDINAL_ENDINGS = frozenset({"st", "nd", "rd", "th"})


def number_words(written: str) -> str:
    """A number as written ("1,234", "3.14", "007") in words."""
    whole, _, fraction = written.replace(",", "").partition(".")
    spoken = cardinal(whole)
    return f"{spoken} point {digits(fraction)}" if fraction else spoken


def cardinal(whole: str) -> str:
    if (len(whole) > 1 and whole[0] == "0") or len(whole) > MAX_CARDINAL_DIGITS:
        return digits(whole)
    return num2words(int(whole), lang="en").replace(",", "")


def digits(written: str) -> str:
    return " ".join(DIGIT_WORDS[digit] for digit in written)


def ordinal(whole: str) -> str:
    """1st to the 15-digit numbers in words; a longer one digit by digit, its last digit an ordinal
    ("one two ... third": no int() of a number of any length)."""
    if len(whole) > MAX_CARDINAL_DIGITS:
        return f"{digits(whole[:-1])} {ORDINAL_DIGIT_WORDS[whole[-1]]}"
    return num2words(int(whole), lang="en", to="ordinal").replace(",", "")


def year(whole: str) -> str:
    """A year as said ("nineteen ninety"); a number longer than a year's as cardinal() says it."""
    return num2words(int(whole), lang="en", to="year").replace(",", "") if len(whole) <= 4 else cardinal(whole)


def is_year(written: str) -> bool:
    return len(written) == 4 and written.isdigit() and 1100 <= int(written) <= 2099


def decade(written: str) -> str | None:
    """The 1990s, the 80s: "nineteen nineties", "eighties"."""
    if written[-1] != "0" or not (is_year(written) or (len(written) == 2 and written[0] != "0")):
        return None
    words = year(written) if len(written) == 4 else cardinal(written)
    return words[:-1] + "ies" if words.endswith("y") else words + "s"
