"""Tests of the shop's own tasks, as a project would write them (docs/testing.md).

They run with Django's runner (``manage.py test shop``) or pytest (``pytest``,
with pytest-django: the ``rdbtasks`` fixture), on any database.
"""

import datetime as dt
from unittest import mock

from django.core.management import call_command
from django.test import TestCase, TransactionTestCase

from django_rdbtasks.models import WorkflowStep
from django_rdbtasks.states import OutcomeKind, WorkflowState
from django_rdbtasks.testing import Harness

from .models import Invoice
from .tasks import checkout, nightly_report, send_invoice

MAIL_UP = 0.5  # send_invoice fails when random.random() < 0.1: the mail server is down
MAIL_DOWN = 0.05


class SendInvoiceTests(TestCase):
    def setUp(self):
        self.rdbtasks = Harness()
        self.addCleanup(self.rdbtasks.close)
        self.rdbtasks.freeze()

    def test_the_email_is_enqueued_with_the_invoice(self):
        invoice = Invoice.objects.create(customer="a@example.com", amount_cents=500)
        send_invoice.enqueue(invoice.pk)
        self.rdbtasks.assert_enqueued(send_invoice, args=[invoice.pk], queue="emails")

    def test_a_send_that_fails_is_retried_after_its_backoff(self):
        invoice = Invoice.objects.create(customer="b@example.com", amount_cents=700)
        send_invoice.enqueue(invoice.pk)
        with mock.patch("shop.tasks.random.random", side_effect=[MAIL_DOWN, MAIL_UP]):
            first = self.rdbtasks.drain()
            self.assertEqual([r.outcome for r in first], [OutcomeKind.RETRY])
            self.assertIsInstance(first[0].error, ConnectionError)
            invoice.refresh_from_db()
            self.assertIsNone(invoice.sent_at)
            # Not due again until its backoff (backoff=1.0: between 0.5 and 1 s) has passed.
            self.assertEqual(len(self.rdbtasks.drain()), 0)
            self.rdbtasks.advance(seconds=1)
            second = self.rdbtasks.drain()
        self.assertEqual([r.outcome for r in second], [OutcomeKind.SUCCESS])
        invoice.refresh_from_db()
        self.assertIsNotNone(invoice.sent_at)
        self.assertEqual(send_invoice.get_result(first[0].id).attempts, 2)


class CheckoutTests(TestCase):
    def setUp(self):
        self.rdbtasks = Harness()
        self.addCleanup(self.rdbtasks.close)
        self.rdbtasks.freeze()

    def test_the_card_is_charged_and_the_invoice_sent(self):
        invoice = Invoice.objects.create(customer="c@example.com", amount_cents=900)
        results = checkout(invoice.pk)
        with mock.patch("shop.tasks.random.random", return_value=MAIL_UP):
            self.rdbtasks.drain()
        invoice.refresh_from_db()
        self.assertEqual(invoice.payment, f"pay-{invoice.pk}")
        self.assertIsNotNone(invoice.sent_at)
        self.assertFalse(invoice.refunded)
        workflow = WorkflowStep.objects.get(task_id=results["send"].id).workflow
        self.assertEqual(workflow.state, WorkflowState.SUCCEEDED)

    def test_the_card_is_refunded_when_the_invoice_cannot_be_sent(self):
        invoice = Invoice.objects.create(customer="d@example.com", amount_cents=900)
        results = checkout(invoice.pk)
        with mock.patch("shop.tasks.random.random", return_value=MAIL_DOWN):
            # Five attempts, each after its backoff: the clock moves, nothing sleeps.
            for _ in range(5):
                self.rdbtasks.drain()
                self.rdbtasks.advance(minutes=10)
            self.rdbtasks.drain()  # the refund
        invoice.refresh_from_db()
        self.assertIsNone(invoice.sent_at)
        self.assertTrue(invoice.refunded)
        self.assertEqual(send_invoice.get_result(results["send"].id).attempts, 5)
        workflow = WorkflowStep.objects.get(task_id=results["send"].id).workflow
        self.assertEqual(workflow.state, WorkflowState.COMPENSATED)


class NightlyReportTests(TestCase):
    def setUp(self):
        self.rdbtasks = Harness()
        self.addCleanup(self.rdbtasks.close)

    def test_the_report_fires_once_a_night_at_three_in_berlin(self):
        # 01:30 UTC is 02:30 in Berlin in winter: the job is synced then.
        self.rdbtasks.freeze(dt.datetime(2030, 1, 15, 1, 30, tzinfo=dt.UTC))
        self.assertEqual(self.rdbtasks.tick_jobs(), 0)
        self.rdbtasks.advance(minutes=29)
        self.assertEqual(self.rdbtasks.tick_jobs(), 0)
        self.rdbtasks.advance(minutes=1)  # 03:00 in Berlin
        self.assertEqual(self.rdbtasks.tick_jobs(), 1)
        self.assertEqual(self.rdbtasks.tick_jobs(), 0)  # each tick once
        ran = self.rdbtasks.drain()
        self.assertEqual([r.task_path for r in ran], [nightly_report.module_path])
        self.rdbtasks.advance(hours=24)
        self.assertEqual(len(self.rdbtasks.drain(jobs=True)), 1)


class RealWorkerTests(TransactionTestCase):
    """The second way: worker processes, which see only what is committed."""

    def test_a_burst_worker_sends_the_invoice(self):
        invoice = Invoice.objects.create(customer="f@example.com", amount_cents=100)
        send_invoice.enqueue(invoice.pk)
        with mock.patch("shop.tasks.random.random", return_value=MAIL_UP):
            call_command("runworkers", "--burst", "--no-scheduler", "--poll-interval", "0.05")
        invoice.refresh_from_db()
        self.assertIsNotNone(invoice.sent_at)


def test_with_the_pytest_fixture(rdbtasks):
    invoice = Invoice.objects.create(customer="e@example.com", amount_cents=100)
    with rdbtasks.captured_tasks() as captured:
        send_invoice.enqueue(invoice.pk)
    captured.assert_enqueued(send_invoice, args=[invoice.pk])
    with mock.patch("shop.tasks.random.random", return_value=MAIL_UP):
        assert [r.outcome for r in rdbtasks.drain()] == [OutcomeKind.SUCCESS]
