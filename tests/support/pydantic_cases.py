"""Twenty schemas as users write them, with pydantic (unions, optionals, enums, nested lists, dates, discriminated
unions), each with a question a user would ask a small chat model. Used on the trained model
(tests/runtime/test_structured_trained.py) and by benchmarks/structured_quality.py."""
import datetime
import enum
from typing import Annotated, Literal, Union

from pydantic import BaseModel, Field


class CityFacts(BaseModel):
    city: str = Field(max_length=30)
    country: str = Field(max_length=30)
    population_millions: float = Field(ge=0, le=100)


class Color(str, enum.Enum):
    red = "red"
    green = "green"
    blue = "blue"


class Fruit(BaseModel):
    name: str
    color: Color
    sweet: bool


class Recipe(BaseModel):
    title: str
    servings: int = Field(ge=1, le=12)
    ingredients: list[str] = Field(min_length=1, max_length=8)
    steps: list[str] = Field(max_length=6)


class Person(BaseModel):
    name: str
    age: int | None = None
    email: str | None = None


class Event(BaseModel):
    name: str
    date: datetime.date
    location: str


class Meeting(BaseModel):
    title: str
    starts_at: datetime.datetime
    attendees: list[str]


class Address(BaseModel):
    street: str
    city: str
    postal_code: str


class Company(BaseModel):
    name: str
    founded: int = Field(ge=1800, le=2030)
    headquarters: Address


class Cat(BaseModel):
    kind: Literal["cat"]
    name: str
    indoor: bool


class Dog(BaseModel):
    kind: Literal["dog"]
    name: str
    breed: str


class PetOwner(BaseModel):
    owner: str
    pet: Annotated[Union[Cat, Dog], Field(discriminator="kind")]


class Sentiment(BaseModel):
    text: str
    label: Literal["positive", "negative", "neutral"]
    confidence: float = Field(ge=0, le=1)


class Book(BaseModel):
    title: str
    author: str
    year: int
    genres: list[str]


class Library(BaseModel):
    books: list[Book] = Field(max_length=3)


class Task(BaseModel):
    title: str
    done: bool
    priority: Literal["low", "medium", "high"]


class TodoList(BaseModel):
    owner: str
    tasks: list[Task] = Field(max_length=4)


class Weather(BaseModel):
    city: str
    temperature_celsius: float
    conditions: Literal["sunny", "cloudy", "rainy", "snowy"]


class Product(BaseModel):
    name: str
    price: float = Field(gt=0)
    currency: Literal["USD", "EUR", "GBP"]
    tags: list[str] = []


class Point(BaseModel):
    x: float
    y: float


class Shape(BaseModel):
    name: str
    vertices: list[Point] = Field(max_length=4)


class Translation(BaseModel):
    source_language: str
    target_language: str
    text: str
    translation: str


class Movie(BaseModel):
    title: str
    year: int = Field(ge=1880, le=2030)
    director: str | None
    rating: float | None = Field(default=None, ge=0, le=10)


class Contact(BaseModel):
    name: str
    phones: list[str] = Field(max_length=2)
    address: Address | None = None


class Answer(BaseModel):
    question: str
    answer: str
    sources: list[str] = Field(max_length=3)


class Planet(BaseModel):
    name: str
    moons: int = Field(ge=0)
    has_rings: bool
    distance_from_sun_au: float


CASES = [
    (CityFacts, "What is the capital of France and its population in millions? Answer in JSON."),
    (Fruit, "Describe a banana as JSON."),
    (Recipe, "Give me a simple pancake recipe as JSON."),
    (Person, "Extract the person: 'Alice Smith, 34, alice@example.com'. Answer in JSON."),
    (Event, "The Olympic Games open in Paris on 26 July 2024. Give the event as JSON."),
    (Meeting, "Schedule a team meeting on 2025-03-14 at 10:00 with Bob and Carol. Answer in JSON."),
    (Company, "Describe the company Apple as JSON."),
    (PetOwner, "John has a dog called Rex, a labrador. Answer in JSON."),
    (Sentiment, "Classify the sentiment of: 'I love this phone, it works great!'. Answer in JSON."),
    (Library, "List two famous novels as JSON."),
    (TodoList, "Make a todo list for Sam with three chores as JSON."),
    (Weather, "It is 21 degrees and sunny in Madrid. Give the weather as JSON."),
    (Product, "A coffee mug costs 12.50 euros. Describe the product as JSON."),
    (Shape, "Describe a unit square with its vertices as JSON."),
    (Translation, "Translate 'good morning' into French. Answer in JSON."),
    (Movie, "Describe the movie Inception as JSON."),
    (Contact, "Give the contact details of a plumber named Mario as JSON."),
    (Answer, "What is the boiling point of water at sea level? Answer in JSON."),
    (Planet, "Describe the planet Saturn as JSON."),
    (Book, "Describe the book 1984 as JSON."),
]
