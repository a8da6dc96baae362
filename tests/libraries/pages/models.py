"""A page type an editor can create in Wagtail's admin (Page itself cannot be)."""

from django.db import models
from wagtail.admin.panels import FieldPanel
from wagtail.models import Page
from wagtail.search import index


class ArticlePage(Page):
    body = models.TextField(blank=True)

    search_fields = [*Page.search_fields, index.SearchField("body")]
    content_panels = [*Page.content_panels, FieldPanel("body")]
