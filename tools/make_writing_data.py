"""Generate the offline samples of the writing tasks: ``writing_posts.jsonl`` and ``writing_abstracts.jsonl``.

Every text is assembled from sentence templates written for this package (no third-party text), so the files can
ship with the code. The generator is seeded, so re-running it rewrites byte-identical files:

    python tools/make_writing_data.py

Posts read like forum posts asking for advice (the ``writing-summary`` task); abstracts read like research
abstracts of made-up studies (the ``writing-intro`` task). Each row is ``{"id", "topic", "title", "document"}``.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

# The files ship with the package, next to the writing task.
DATA_DIR = Path(__file__).resolve().parents[1] / "trl_collm" / "tasks" / "data"
NUM_ROWS = 120  # per file; the task promises >= 100
# Posts are drawn from a longer pool: the first NUM_ROWS as before (train rows unchanged), then only the pool's
# held-out rows beyond them, so that an evaluation can resolve a change (9 held-out posts gave an SE of ~0.1 on the
# return; 86 give ~0.04 at one play each).
POST_POOL_ROWS = 720
MIN_WORDS, MAX_WORDS = 80, 250

# ----------------------------------------------------------------------------------------------------------------
# Posts
# ----------------------------------------------------------------------------------------------------------------

# Shared slot values; each post draws its own fill, so the same situation reads differently across rows.
SLOTS = {
    "age": [str(a) for a in range(19, 58)],
    "partner": ["my partner", "my wife", "my husband", "my girlfriend", "my boyfriend", "my fiancee"],
    "friend": ["Maya", "Tom", "Priya", "Lukas", "Ines", "Omar", "Hannah", "Diego", "Aiko", "Sam", "Nadia", "Felix"],
    "city": ["Leeds", "Denver", "Lyon", "Porto", "Austin", "Tampere", "Adelaide", "Ghent", "Calgary", "Bologna"],
    "months": ["three", "four", "six", "eight", "ten", "eighteen"],
    "years": ["two", "three", "five", "seven", "nine", "twelve"],
    "money": ["$300", "$450", "$800", "$1,200", "$2,000", "$150"],
    "day": ["Monday", "Tuesday", "Thursday", "Friday", "Saturday", "Sunday"],
    "pet": ["dog", "cat", "rabbit", "parrot"],
}

OPENERS = [
    "Long time lurker, first post here.",
    "Sorry for the wall of text, I tried to keep it short.",
    "Posting from my phone, so excuse the formatting.",
    "Throwaway account because some people I know read this forum.",
    "Not sure this is the right place, but here goes.",
    "",
    "",
    "",
]

CLOSERS = [
    "Thanks in advance for any advice.",
    "Any thoughts are welcome, even blunt ones.",
    "I appreciate anyone who read this far.",
    "Edit: fixed a few typos.",
    "",
    "",
]

# topic -> forum, title templates, and ordered sentence pools (setup, details, problem, tried, ask).
POST_TOPICS = {
    "roommates": {
        "forum": "relationships",
        "titles": ["Roommate never cleans the kitchen", "How do I talk to my roommate about chores?"],
        "setup": [
            "I ({age}) have shared a flat in {city} with {friend} for {months} months.",
            "{friend} and I moved into a two bedroom place in {city} about {months} months ago.",
        ],
        "details": [
            "We split rent evenly and agreed on a chore chart on the first day.",
            "At first everything was fine and we even cooked dinner together on weekends.",
            "Lately the sink is full of pans by {day} and the bins overflow.",
            "I work early shifts, so I usually end up cleaning before I leave.",
            "{friend} works from home and says the mess is only there because they are busy.",
        ],
        "problem": [
            "Last week I found mold on a plate that had been sitting there for days, and I snapped.",
            "When I brought it up calmly, {friend} laughed and said I was being dramatic.",
        ],
        "tried": [
            "I tried leaving notes, then a shared calendar, and neither lasted more than a week.",
            "I offered to swap tasks so they only handle the bins, but nothing changed.",
        ],
        "ask": [
            "How do I raise this again without ruining the friendship?",
            "Is it reasonable to ask them to pay for a cleaner, or is that petty?",
        ],
    },
    "job-offer": {
        "forum": "careerguidance",
        "titles": ["Two job offers, cannot decide", "Stay at a stable job or take a risky offer?"],
        "setup": [
            "I am {age} and have worked as a lab technician for {years} years.",
            "After {years} years at the same logistics company I started applying elsewhere.",
        ],
        "details": [
            "My current job is stable, the team is kind, and the commute is ten minutes.",
            "The new offer is from a startup in {city} and pays about {money} more per month.",
            "The startup raised money recently but has fewer than thirty employees.",
            "{partner} is supportive but worried about moving away from family.",
            "My manager hinted that a promotion might come next year, though nothing is written down.",
        ],
        "problem": [
            "The startup wants an answer by {day}, and I keep changing my mind every hour.",
            "I have savings for about {months} months if the startup folds.",
        ],
        "tried": [
            "I made a pros and cons list, but both columns ended up the same length.",
            "I asked the startup for a week more and they agreed to two extra days.",
        ],
        "ask": [
            "For people who took the leap, did you regret it?",
            "What questions should I ask the startup before signing?",
        ],
    },
    "learning-piano": {
        "forum": "piano",
        "titles": ["Adult beginner stuck after a few months", "Is it too late to learn piano at my age?"],
        "setup": [
            "I started piano at {age} with no musical background at all.",
            "About {months} months ago I bought a used keyboard for {money} and started lessons.",
        ],
        "details": [
            "I practice around thirty minutes most evenings after work.",
            "My teacher is patient and gives me one new piece every two weeks.",
            "I can play simple songs with my right hand, but combining both hands falls apart.",
            "Scales feel boring, so I sometimes skip them and go straight to songs.",
            "Recording myself helped me notice that I rush every time the music gets hard.",
        ],
        "problem": [
            "For the last month I feel like I have not improved at all.",
            "I get frustrated and quit the session early more often than I would like to admit.",
        ],
        "tried": [
            "I tried slowing down with a metronome, which helps until I speed up again.",
            "I switched to shorter sessions twice a day for a week.",
        ],
        "ask": [
            "Is a plateau like this normal, and how did you get past it?",
            "Should I change teachers or just be more patient?",
        ],
    },
    "moving-city": {
        "forum": "personalfinance",
        "titles": ["Moving to a more expensive city for love", "Budgeting for a move to {city}"],
        "setup": [
            "{partner} got a residency position in {city}, and I plan to follow in {months} months.",
            "I am {age}, rent a cheap place, and have a remote job that lets me live anywhere.",
        ],
        "details": [
            "Rent in {city} is roughly double what I pay now.",
            "I have about {money} saved for the move, which does not feel like much.",
            "We would sign a lease together for the first time.",
            "My employer allows remote work but pays less for some regions.",
            "I also carry a small car loan that ends in {years} years.",
        ],
        "problem": [
            "I am scared that we will drain our savings in the first few months.",
            "My parents think I am moving too fast and keep sending me articles about debt.",
        ],
        "tried": [
            "I built a spreadsheet with three scenarios, from frugal to comfortable.",
            "I asked my bank about a small emergency credit line, just in case.",
        ],
        "ask": [
            "What costs do people usually forget when moving to a pricier city?",
            "How much of an emergency fund would you keep before the move?",
        ],
    },
    "senior-pet": {
        "forum": "pets",
        "titles": ["My old {pet} stopped eating", "Caring for a senior {pet} on a budget"],
        "setup": [
            "My {pet} is almost fourteen and has lived with me for {years} years.",
            "We adopted our {pet} from a shelter when I was a student, and now it is a senior.",
        ],
        "details": [
            "Over the past two weeks it eats maybe half of its usual food.",
            "It still drinks water and enjoys short walks around the block.",
            "The vet ran blood tests that came back mostly normal.",
            "A specialist visit would cost around {money}, which I can only just afford.",
            "{partner} thinks we should try a softer food before spending more money.",
        ],
        "problem": [
            "I feel guilty either way, as if choosing money over my pet.",
            "Yesterday it hid under the bed all evening, which it never does.",
        ],
        "tried": [
            "I warmed the food slightly and added plain broth, which helped a little.",
            "I moved its bowl to a quieter room in case the noise bothered it.",
        ],
        "ask": [
            "Has anyone been through this, and was the specialist worth it?",
            "What signs tell you it is time to stop tests and focus on comfort?",
        ],
    },
    "neighbor-noise": {
        "forum": "legaladvice",
        "titles": ["Neighbor plays loud music every night", "Noise complaint etiquette"],
        "setup": [
            "I live in a rented apartment in {city} and work night shifts as a nurse.",
            "New neighbors moved in above me about {months} months ago.",
        ],
        "details": [
            "Most nights there is bass until two in the morning, even on weekdays.",
            "I sleep during the day, so I did not notice at first.",
            "On my nights off I cannot fall asleep before three.",
            "The building rules say quiet hours start at ten.",
            "Other tenants complained in the group chat but nobody did anything official.",
        ],
        "problem": [
            "I knocked once and the guy was polite, but the music was back the next {day}.",
            "My landlord says it is not his job to manage neighbors.",
        ],
        "tried": [
            "I bought earplugs and a white noise machine, which only help a bit.",
            "I left a friendly note with my phone number, and nobody called.",
        ],
        "ask": [
            "What are my options before involving the police?",
            "Can I withhold part of the rent until the landlord acts, or is that a bad idea?",
        ],
    },
    "first-marathon": {
        "forum": "running",
        "titles": ["First marathon in {months} months, plan check", "Knee pain while training for a marathon"],
        "setup": [
            "I am {age} and signed up for my first marathon in {city}.",
            "Two years ago I could not run for five minutes; now I run four times a week.",
        ],
        "details": [
            "My longest run so far is twenty-four kilometers.",
            "I follow a free online plan with one long run every {day}.",
            "My pace is slow but steady, and I am fine finishing near the back.",
            "I bought new shoes last month after the old ones wore out.",
            "Strength training is the part of the plan I skip most often.",
        ],
        "problem": [
            "Last week my outer knee started aching after about fifteen kilometers.",
            "I am worried that I increased the distance too fast.",
        ],
        "tried": [
            "I rested for four days, iced it, and did some stretches from a video.",
            "I swapped one run for cycling, which does not hurt at all.",
        ],
        "ask": [
            "Should I see a physiotherapist now or wait and see?",
            "Is it smarter to defer the race than to push through?",
        ],
    },
    "garden": {
        "forum": "gardening",
        "titles": ["Tomatoes splitting and leaves curling", "First vegetable garden, what went wrong?"],
        "setup": [
            "This is my first year with a vegetable patch behind our house.",
            "{partner} and I turned part of the lawn into raised beds this spring.",
        ],
        "details": [
            "We planted tomatoes, beans, zucchini and a row of herbs.",
            "The beans did great and we already gave bags of them to neighbors.",
            "The tomatoes grew tall but many fruits split right before they ripen.",
            "Some leaves curl upward and have yellow edges.",
            "We had a dry month followed by a week of heavy rain.",
        ],
        "problem": [
            "I water in the evening, sometimes a lot if I missed a day.",
            "A neighbor says it is a disease, another says it is just the weather.",
        ],
        "tried": [
            "I added mulch around the stems and started watering in the morning.",
            "I removed the worst leaves and sent a photo to the local garden center.",
        ],
        "ask": [
            "Is this a watering problem or something I should treat?",
            "What would you change for next season?",
        ],
    },
    "budget-debt": {
        "forum": "personalfinance",
        "titles": ["Paying off a credit card while saving", "Am I doing my debt plan right?"],
        "setup": [
            "I am {age}, earn an average salary, and owe {money} on a credit card.",
            "After a rough year I ended up with card debt for the first time.",
        ],
        "details": [
            "The interest rate is above twenty percent.",
            "I also have a small emergency fund in a savings account.",
            "My employer matches retirement contributions up to a limit.",
            "I tracked spending for {months} months and found a lot of takeout.",
            "Rent and groceries take most of what is left after taxes.",
        ],
        "problem": [
            "I cannot decide whether to empty the emergency fund to clear the card.",
            "Every time I make progress, some surprise bill shows up.",
        ],
        "tried": [
            "I cancelled two subscriptions and started cooking on {day}s for the week.",
            "I called the bank to ask for a lower rate, and they said no.",
        ],
        "ask": [
            "Would you pay the card off first or keep the cushion?",
            "Is it worth pausing retirement contributions for a while?",
        ],
    },
    "friendship": {
        "forum": "relationships",
        "titles": ["Best friend and I are drifting apart", "Friend only calls when she needs something"],
        "setup": [
            "{friend} and I have been close friends for {years} years.",
            "I met {friend} at university and we used to talk every day.",
        ],
        "details": [
            "Since {friend} moved to {city}, we talk maybe once a month.",
            "When we do talk, it is mostly about problems at their work.",
            "I planned two visits and both were cancelled at the last minute.",
            "I know they are busy with a new job and a new relationship.",
            "Our group chat with old classmates is quiet for weeks at a time.",
        ],
        "problem": [
            "Their birthday is next {day}, and I do not know whether to make an effort again.",
            "I feel like I am the only one who keeps this friendship going.",
        ],
        "tried": [
            "I told them honestly that I miss them, and they said they miss me too.",
            "I suggested a standing video call once a week, which lasted a month.",
        ],
        "ask": [
            "How do you tell whether a friendship is changing or ending?",
            "Should I step back and see if they reach out?",
        ],
    },
    "used-car": {
        "forum": "cars",
        "titles": ["Bought a used car, check engine light already", "Seller will not answer after the sale"],
        "setup": [
            "Three weeks ago I bought a ten year old hatchback for my commute.",
            "I am {age} and this is the first car I bought on my own.",
        ],
        "details": [
            "The seller said it had a fresh service and new brakes.",
            "I paid {money} less than the listed price after a short test drive.",
            "I did not get an independent inspection because I was in a hurry.",
            "The car drives fine, but the engine light came on yesterday.",
            "A cheap code reader says there is a sensor fault.",
        ],
        "problem": [
            "The seller stopped answering messages after I asked about the light.",
            "A garage quoted more than I expected to replace the part.",
        ],
        "tried": [
            "I cleared the code and it came back after two days.",
            "I checked the service book and one stamp looks suspicious.",
        ],
        "ask": [
            "Is there anything I can do about the seller, or is this on me?",
            "Should I fix the sensor or sell the car before it gets worse?",
        ],
    },
    "study-exam": {
        "forum": "GetStudying",
        "titles": ["Exam in {months} weeks and I keep procrastinating", "Study plan for a licensing exam"],
        "setup": [
            "I am taking a professional licensing exam in {city} soon.",
            "I am {age}, work full time, and study for an accounting exam at night.",
        ],
        "details": [
            "The material covers six large sections and I have finished two.",
            "Practice tests show I am good at theory but slow at calculations.",
            "I study best in the library, but it closes early on {day}s.",
            "My phone is the biggest distraction, even when it is on silent.",
            "A coworker passed last year and lent me her notes.",
        ],
        "problem": [
            "I sit down to study and then lose an hour to nothing.",
            "I failed a practice test last week and lost confidence.",
        ],
        "tried": [
            "I tried short focused blocks with breaks, which works for a few days.",
            "I joined an online study group, but the sessions run at bad times for me.",
        ],
        "ask": [
            "What schedule worked for you when studying next to a job?",
            "How do you stop a bad practice score from killing your motivation?",
        ],
    },
    "bakery": {
        "forum": "smallbusiness",
        "titles": ["Turning a home bakery into a real business", "Pricing my bread at the weekend market"],
        "setup": [
            "I have been baking sourdough for friends for {years} years.",
            "Last spring I started selling bread at a weekend market in {city}.",
        ],
        "details": [
            "I bake about forty loaves on Friday night and sell out by noon.",
            "Ingredients are cheap, but the market stall costs {money} per season.",
            "People ask for pastries, which I have never sold before.",
            "My kitchen oven fits only four loaves at a time.",
            "I keep my day job and bake in the evenings.",
        ],
        "problem": [
            "After counting my hours, I earn less than minimum wage.",
            "A cafe asked for a weekly order, which I cannot fill with one oven.",
        ],
        "tried": [
            "I raised prices a little and nobody complained.",
            "I looked into renting a shared commercial kitchen on {day}s.",
        ],
        "ask": [
            "How did you decide when to invest in better equipment?",
            "Is it wise to take the cafe order before I have the capacity?",
        ],
    },
    "volunteering": {
        "forum": "volunteer",
        "titles": ["Burned out from volunteering", "Leading a food bank shift for the first time"],
        "setup": [
            "I have volunteered at a local food bank for {years} years.",
            "I am {age} and recently became a shift lead at a community food bank.",
        ],
        "details": [
            "Our shift sorts donations and packs boxes for about ninety families.",
            "Half the volunteers are students who come for a few weeks.",
            "The coordinator left in spring and nobody replaced her.",
            "I now handle the schedule, the keys and most of the emails.",
            "Every {day} I spend three extra hours planning.",
        ],
        "problem": [
            "I love the work but dread opening my inbox.",
            "Two regulars quit after a disagreement about rules, and I felt responsible.",
        ],
        "tried": [
            "I asked the board for help and they promised to discuss it.",
            "I wrote a short handbook so new people can start without me.",
        ],
        "ask": [
            "How do you set limits as a volunteer without letting people down?",
            "What made your volunteer team work well together?",
        ],
    },
}


def _fill(template: str, slots: dict) -> str:
    return template.format(**slots)


def _post(rng: random.Random, topic: str, spec: dict) -> dict:
    slots = {k: rng.choice(v) for k, v in SLOTS.items()}
    parts = [rng.choice(OPENERS), rng.choice(spec["setup"])]
    parts += rng.sample(spec["details"], rng.randint(2, 5))  # sample keeps each detail once, in random order
    parts += [rng.choice(spec["problem"])]
    parts += rng.sample(spec["tried"], rng.randint(1, 2))
    parts += [rng.choice(spec["ask"]), rng.choice(CLOSERS)]
    text = " ".join(_fill(p, slots) for p in parts if p)
    title = _fill(rng.choice(spec["titles"]), slots)
    return {"topic": f"{spec['forum']}/{topic}", "title": title, "document": text}


# ----------------------------------------------------------------------------------------------------------------
# Abstracts
# ----------------------------------------------------------------------------------------------------------------

# field -> nouns that make a made-up study in that field; the sentence templates below are shared.
FIELDS = {
    "ecology": {
        "object": ["pollinator visits", "bird migration timing", "wetland plant cover", "coral bleaching"],
        "setting": ["fragmented farmland", "coastal reserves", "mountain meadows", "urban parks"],
        "gap": "field surveys are sparse and rarely repeated over the same sites",
        "method": ["acoustic sensors", "drone imagery", "citizen science records", "environmental DNA samples"],
        "model": "a hierarchical occupancy model",
        "data": "{n} sites monitored over {y} seasons",
        "metric": "detection accuracy",
        "impact": "conservation agencies could target restoration where it matters most",
    },
    "materials": {
        "object": ["solid electrolytes", "recycled concrete", "perovskite films", "biodegradable plastics"],
        "setting": ["room temperature", "humid climates", "low cost production", "repeated loading"],
        "gap": "screening candidate compositions in the lab is slow and expensive",
        "method": ["high throughput synthesis", "X-ray diffraction", "thermal cycling tests", "microscopy images"],
        "model": "a graph neural network surrogate",
        "data": "{n} compositions tested in {y} batches",
        "metric": "prediction error",
        "impact": "manufacturers could shorten development cycles for safer products",
    },
    "language": {
        "object": ["machine translation", "summarization", "question answering", "dialogue agents"],
        "setting": ["low resource languages", "long documents", "noisy user input", "specialized domains"],
        "gap": "existing benchmarks overstate quality because test sets leak into training data",
        "method": ["contrastive pretraining", "retrieval augmentation", "curriculum learning", "synthetic data"],
        "model": "a compact transformer",
        "data": "{n} language pairs and {y} evaluation suites",
        "metric": "human preference rate",
        "impact": "smaller groups could build useful tools without large compute budgets",
    },
    "robotics": {
        "object": ["grasping deformable objects", "legged locomotion", "warehouse navigation", "assembly tasks"],
        "setting": ["cluttered scenes", "uneven terrain", "shared workspaces", "changing lighting"],
        "gap": "policies trained in simulation often fail when transferred to real hardware",
        "method": ["domain randomization", "tactile feedback", "imitation learning", "model predictive control"],
        "model": "a policy with a learned dynamics model",
        "data": "{n} real trials on {y} robot platforms",
        "metric": "task success rate",
        "impact": "robots could be deployed with less manual tuning",
    },
    "epidemiology": {
        "object": ["influenza spread", "vaccination uptake", "hospital readmissions", "foodborne outbreaks"],
        "setting": ["rural districts", "dense cities", "school networks", "aging populations"],
        "gap": "surveillance data arrive late and are reported unevenly across regions",
        "method": ["wastewater sampling", "mobility data", "pharmacy sales", "syndromic reports"],
        "model": "a spatial transmission model",
        "data": "{n} districts followed for {y} years",
        "metric": "forecast error",
        "impact": "health authorities could act days earlier during outbreaks",
    },
    "hydrology": {
        "object": ["flash floods", "groundwater recharge", "river sediment transport", "snowmelt runoff"],
        "setting": ["steep catchments", "semi arid basins", "glacier fed rivers", "urban drainage systems"],
        "gap": "gauging stations are few and many small rivers are not measured at all",
        "method": ["satellite rainfall", "soil moisture probes", "radar altimetry", "low cost water level sensors"],
        "model": "a physics informed neural network",
        "data": "{n} catchments over {y} years",
        "metric": "peak flow error",
        "impact": "local governments could issue better warnings with existing budgets",
    },
    "education": {
        "object": ["reading fluency", "math anxiety", "student attendance", "peer tutoring outcomes"],
        "setting": ["primary schools", "online courses", "vocational programs", "multilingual classrooms"],
        "gap": "interventions are usually evaluated in small pilots that do not generalize",
        "method": ["randomized classroom trials", "learning analytics", "teacher interviews", "adaptive exercises"],
        "model": "a multilevel regression",
        "data": "{n} students in {y} schools",
        "metric": "test score gains",
        "impact": "school leaders could choose programs with stronger evidence",
    },
    "economics": {
        "object": ["housing prices", "small business credit", "minimum wage effects", "remote work productivity"],
        "setting": ["mid sized cities", "developing economies", "regional labor markets", "rural banks"],
        "gap": "official statistics are published with long delays and coarse geography",
        "method": ["online listing data", "transaction records", "survey panels", "night light imagery"],
        "model": "a difference in differences design",
        "data": "{n} regions observed over {y} quarters",
        "metric": "estimation bias",
        "impact": "policy makers could evaluate reforms while they are still underway",
    },
    "astronomy": {
        "object": ["exoplanet transits", "variable stars", "fast radio bursts", "galaxy mergers"],
        "setting": ["crowded star fields", "archival survey data", "noisy light curves", "faint distant sources"],
        "gap": "manual vetting of candidates cannot keep up with the volume of new observations",
        "method": ["time series classifiers", "spectral fitting", "image subtraction", "anomaly detection"],
        "model": "a Bayesian classifier",
        "data": "{n} light curves from {y} observing campaigns",
        "metric": "false positive rate",
        "impact": "follow up telescope time could be spent on the most promising targets",
    },
    "agriculture": {
        "object": ["wheat yield", "irrigation scheduling", "soil nitrogen loss", "pest outbreaks"],
        "setting": ["smallholder farms", "drought prone regions", "greenhouses", "rotating crop systems"],
        "gap": "farm decisions rely on rules of thumb that ignore local weather and soil",
        "method": ["sensor networks", "satellite vegetation indices", "field trials", "farmer diaries"],
        "model": "a crop growth simulator coupled with machine learning",
        "data": "{n} fields across {y} growing seasons",
        "metric": "yield prediction error",
        "impact": "farmers could save water and fertilizer without losing harvest",
    },
    "transport": {
        "object": ["bus delays", "bicycle commuting", "traffic crashes", "electric vehicle charging"],
        "setting": ["congested corridors", "suburban networks", "winter conditions", "new cycling lanes"],
        "gap": "planning models are calibrated on old surveys that miss recent travel habits",
        "method": ["smart card data", "GPS traces", "video counts", "charging station logs"],
        "model": "an agent based simulation",
        "data": "{n} routes over {y} months",
        "metric": "travel time error",
        "impact": "transit agencies could adjust schedules and infrastructure faster",
    },
    "energy": {
        "object": ["battery degradation", "solar output", "household demand", "wind farm maintenance"],
        "setting": ["grid scale storage", "cloudy regions", "heat waves", "offshore sites"],
        "gap": "operators plan with average profiles that hide rare but costly events",
        "method": ["cycling experiments", "smart meter data", "weather reanalysis", "vibration sensors"],
        "model": "a probabilistic forecasting model",
        "data": "{n} units monitored for {y} years",
        "metric": "forecast error",
        "impact": "grid operators could lower costs and avoid outages",
    },
}

CONTEXT = [
    "{Object} in {setting} shape decisions for many people, yet remain hard to measure.",
    "Understanding {object} in {setting} is a growing priority for researchers and practitioners.",
    "Reliable estimates of {object} in {setting} are needed for planning, but current tools fall short.",
]
GAP = [
    "A central difficulty is that {gap}.",
    "Progress has been limited because {gap}.",
    "Previous work has struggled since {gap}.",
]
PROPOSAL = [
    "We introduce {name}, an approach that combines {m1} with {m2} through {model}.",
    "This study presents {name}, which links {m1} and {m2} using {model}.",
    "Here we propose {name}, a framework built on {model} that learns from {m1} and {m2}.",
]
DETAIL = [
    "The approach explicitly models uncertainty, so every estimate comes with a credible range.",
    "A simple calibration step lets the method adapt to new {setting} with little extra data.",
    "We release the code and a cleaned version of the data to support replication.",
    "Unlike earlier approaches, it does not require expensive manual labels.",
    "The model is small enough to run on a standard laptop.",
]
EVAL = [
    "We evaluate it on {data}.",
    "Experiments cover {data}.",
    "The evaluation uses {data}, with a held out period for testing.",
]
RESULT = [
    "Compared with strong baselines, {name} reduces {metric} by {pct} percent.",
    "{name} improves {metric} by {pct} percent over the best existing method.",
    "Results show a {pct} percent gain in {metric}, with the largest gains in {setting}.",
]
LIMIT = [
    "Performance drops when inputs are very sparse, which we discuss as a limitation.",
    "An ablation shows that both data sources are necessary for the gains.",
    "Gains are smaller in the most data rich settings, where baselines are already strong.",
    "",
]
IMPACT = [
    "These findings suggest that {impact}.",
    "If adopted, the approach means {impact}.",
    "Beyond this study, the results indicate that {impact}.",
]
SYLLABLES = ["ver", "ta", "lo", "mi", "ka", "ne", "sol", "ri", "do", "pha", "zen", "tor", "lu", "ga", "bri"]


def _method_name(rng: random.Random) -> str:
    # Made-up method names in the style of papers (capitalised pseudo-words), unique enough per row.
    return "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 3))).capitalize()


def _abstract(rng: random.Random, field: str, spec: dict) -> dict:
    obj, setting = rng.choice(spec["object"]), rng.choice(spec["setting"])
    m1, m2 = rng.sample(spec["method"], 2)
    slots = {
        "object": obj,
        "Object": obj[0].upper() + obj[1:],
        "setting": setting,
        "gap": spec["gap"],
        "m1": m1,
        "m2": m2,
        "model": spec["model"],
        "name": _method_name(rng),
        "metric": spec["metric"],
        "pct": str(rng.randint(6, 41)),
        "impact": spec["impact"],
    }
    slots["data"] = spec["data"].format(n=rng.choice([12, 24, 40, 56, 85, 120, 300, 1500]), y=rng.randint(2, 9))
    parts = [rng.choice(CONTEXT), rng.choice(GAP), rng.choice(PROPOSAL)]
    parts += rng.sample(DETAIL, rng.randint(1, 3))
    parts += [rng.choice(EVAL), rng.choice(RESULT), rng.choice(LIMIT), rng.choice(IMPACT)]
    text = " ".join(p.format(**slots) for p in parts if p)
    title = f"{slots['name']}: {m1.capitalize()} and {m2} for {obj} in {setting}"
    return {"topic": field, "title": title, "document": text}


# ----------------------------------------------------------------------------------------------------------------


def _words(text: str) -> int:
    return len(re.findall(r"\w+", text))


def generate(make_row, specs: dict, prefix: str, seed: int, num_rows: int = NUM_ROWS) -> list[dict]:
    """num_rows unique rows, topics interleaved round-robin so any prefix of the file covers many topics."""
    rng = random.Random(seed)
    rows, seen, names = [], set(), list(specs)
    attempts = 0
    while len(rows) < num_rows:
        attempts += 1
        if attempts > 50 * num_rows:
            raise RuntimeError("could not generate enough unique rows; add templates")
        topic = names[len(rows) % len(names)]
        row = make_row(rng, topic, specs[topic])
        if row["document"] in seen or not (MIN_WORDS <= _words(row["document"]) <= MAX_WORDS):
            continue
        seen.add(row["document"])
        rows.append({"id": f"{prefix}-{len(rows):03d}", **row})
    return rows


def write_jsonl(rows: list[dict], path: Path) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def with_more_held_out(pool: list[dict]) -> list[dict]:
    """The pool's first NUM_ROWS rows, then its later rows that the task's split holds out (never trained on)."""
    from trl_collm.tasks.writing_data import _is_eval  # the task's own split: one definition of held out

    return pool[:NUM_ROWS] + [row for row in pool[NUM_ROWS:] if _is_eval(row["document"])]


def main() -> None:
    posts = generate(_post, POST_TOPICS, "post", seed=1, num_rows=POST_POOL_ROWS)
    write_jsonl(with_more_held_out(posts), DATA_DIR / "writing_posts.jsonl")
    write_jsonl(generate(_abstract, FIELDS, "abstract", seed=2), DATA_DIR / "writing_abstracts.jsonl")


if __name__ == "__main__":
    main()
