"""``path("rdbtasks/", include("django_rdbtasks.urls"))``: the metrics endpoint (``views.py``)."""

from django.urls import path

from . import views

app_name = "django_rdbtasks"
urlpatterns = [path("metrics/", views.metrics, name="metrics")]
